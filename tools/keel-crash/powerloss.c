/*
 * tools/keel-crash/powerloss.c -- libkeel_powerloss.so: simulated power loss
 * for a process writing a keel data directory. Tests only: loaded with
 * LD_PRELOAD into a child (keel-crash --mode powerloss, test_powerloss).
 *
 * A kill -9 leaves the kernel's page cache intact, so everything write(2)
 * returned for reaches the disk anyway. Power loss does not: what had not been
 * made durable is lost. This library keeps, per file under KEEL_POWERLOSS_DIR,
 * an undo journal of the writes that are not durable yet: before each tracked
 * write it saves the bytes of the range and the file's size. The barriers
 * that make writes durable:
 *   fsync / fdatasync on any descriptor of the file   the whole journal
 *   a write on an O_SYNC / O_DSYNC descriptor, or     the 4 KiB pages the write
 *   pwritev2 with RWF_SYNC / RWF_DSYNC                touched, once it returned
 *   msync(MS_SYNC) over a mapping of the file         the pages of the range
 *   sync(), syncfs()                                  every file (of that fs)
 * (the barriers also make the file's current size durable, as the kernel's
 * datasync does). sync_file_range is not a barrier: it flushes neither the
 * disk's cache nor metadata.
 *
 * At the N-th tracked write call (KEEL_POWERLOSS_CUT=N, counted over all
 * files: write, pwrite, writev, pwritev, pwritev2, ftruncate and an O_TRUNC
 * open of a non-empty file) that call is not performed; instead:
 *   drop mode  every unsynced write of every file is undone, newest first,
 *              and each file gets back its durable size;
 *   tear mode  (KEEL_POWERLOSS_MODE=tear, KEEL_POWERLOSS_SEED=S) every 4 KiB
 *              page that unsynced writes touched either reached the disk (its
 *              current content stays) or not (its durable content comes back),
 *              chosen per page from S, the file's name and the page number; the
 *              file's size is the durable or the current one (one choice per
 *              file); the call in flight tears the same way: each of its pages
 *              is written or not.
 * A file this process created whose directory entry was never made durable
 * (no fsync of the file or of its directory since) disappears (drop), or
 * disappears or stays by one choice (tear); fsyncing a new file makes its
 * entry durable, as on ext4 and XFS, where the fsync commits the journal
 * transaction that created it. Then the files and the directory are fsynced
 * (the simulation's result must reach the real disk), KEEL_POWERLOSS_STATS is
 * written, and the process raises SIGKILL. Every tracked operation takes one
 * mutex, held across the real call, so a cut is atomic with respect to the
 * other threads' writes: a call either finished before the cut (and is
 * journaled) or never runs.
 *
 * What it does not model: a disk that acknowledges a flush it has not done
 * (the barriers are trusted), reordering or loss inside a range a barrier
 * covered, writes torn below 4 KiB (a sector), directory operations other
 * than file creation (rename, unlink, mkdir of the data directory itself),
 * writes through a shared writable mapping (they cannot be seen: such a file
 * is counted in `mapped=` and left as it is at the cut; keel's LMDB
 * environment is opened without MDB_WRITEMAP, so only lock.mdb, which LMDB
 * rebuilds at open, is mapped that way), stdio streams, descriptors inherited
 * across exec, fcntl(F_DUPFD), mremap, fallocate, truncate(2) by path,
 * copy_file_range / sendfile / splice, and other processes writing the same
 * files. The state of a file when this process first opens it is taken as
 * durable.
 *
 * Environment: KEEL_POWERLOSS_DIR (nothing is tracked without it),
 * KEEL_POWERLOSS_CUT (0 or unset: never cut), KEEL_POWERLOSS_MODE (drop, the
 * default, or tear), KEEL_POWERLOSS_SEED, KEEL_POWERLOSS_STATS (a file that
 * receives one line of counters at the cut or at exit), KEEL_POWERLOSS_VERBOSE
 * (a line on stderr at the cut and for each file mapped writable).
 */
#undef _FORTIFY_SOURCE
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

_Static_assert(sizeof(off_t) == 8, "the 64-bit file interfaces are aliases of the plain ones only on LP64");

/* Interposed names without a prototype in the headers (fortified opens). */
int __open_2(const char *path, int flags);
int __open64_2(const char *path, int flags);
int __openat_2(int dirfd, const char *path, int flags);
int __openat64_2(int dirfd, const char *path, int flags);

#define PL_PAGE 4096ull
#define PL_MAXFD 65536

/* Salts of the tear choices: one stream of coins per kind of decision. */
enum { PL_SALT_PAGE = 1, PL_SALT_INFLIGHT, PL_SALT_SIZE, PL_SALT_DIRENT };

/* One journaled operation: the range [off, off + len) it changed, the file's
 * size before it, and the bytes the range held below that size (the part of
 * the range past old_size did not exist: its durable content is zeros). */
typedef struct pl_entry {
    uint64_t off, len, old_size;
    unsigned char *old;
} pl_entry;

typedef struct pl_file {
    dev_t dev;
    ino_t ino;
    char *path;
    uint64_t key;            /* hash of the file name: its tear choices do not depend on the directory */
    int priv;                /* our own O_RDWR descriptor: reads old bytes, restores at the cut */
    uint64_t durable_size;
    bool created;            /* this process created it */
    bool dirent_durable;     /* its directory entry survives a cut */
    bool mapped_writable;    /* mapped MAP_SHARED with PROT_WRITE: left as it is at the cut */
    bool removed;            /* the cut removed it */
    pl_entry *ent;
    size_t nent, cap;
} pl_file;

typedef struct pl_fd {
    pl_file *f;              /* a regular file under the directory, or NULL */
    char *dir;               /* a directory under (or equal to) it, or NULL */
    dev_t dev;               /* what it was opened on: a descriptor closed behind our back */
    ino_t ino;               /* (fclose of an fdopen'ed one) and reused is recognised */
    bool dsync, append;
} pl_fd;

typedef struct pl_map {
    uintptr_t addr;
    size_t len;
    pl_file *f;
    uint64_t off;
} pl_map;

/* A tracked call the cut replaces: a write (its data) or a truncation. */
typedef struct pl_pending {
    pl_file *f;
    uint64_t off, len;
    const struct iovec *iov;
    int iovcnt;
    int64_t trunc;           /* >= 0: truncate to this length instead */
} pl_pending;

static struct {
    int (*openat)(int, const char *, int, ...);
    int (*close)(int);
    int (*dup)(int);
    int (*dup2)(int, int);
    int (*dup3)(int, int, int);
    ssize_t (*write)(int, const void *, size_t);
    ssize_t (*pwrite)(int, const void *, size_t, off_t);
    ssize_t (*writev)(int, const struct iovec *, int);
    ssize_t (*pwritev)(int, const struct iovec *, int, off_t);
    ssize_t (*pwritev2)(int, const struct iovec *, int, off_t, int);
    int (*ftruncate)(int, off_t);
    int (*fsync)(int);
    int (*fdatasync)(int);
    int (*sync_file_range)(int, off_t, off_t, unsigned int);
    int (*msync)(void *, size_t, int);
    void (*sync)(void);
    int (*syncfs)(int);
    void *(*mmap)(void *, size_t, int, int, int, off_t);
    int (*munmap)(void *, size_t);
} real;

static struct {
    pthread_mutex_t mu;
    bool on;                 /* KEEL_POWERLOSS_DIR is set */
    char dir[PATH_MAX];
    size_t dirlen;
    uint64_t cut, seed;
    bool tear, verbose, cut_done;
    char stats[PATH_MAX];
    pl_file **files;
    size_t nfiles, capfiles;
    pl_map *maps;
    size_t nmaps, capmaps;
    /* counters (KEEL_POWERLOSS_STATS) */
    uint64_t writes, syncs, ignored_syncs, bytes_journaled, bytes_undone, pages_dropped, pages_torn, inflight_pages,
        files_removed, mapped;
} pl = {.mu = PTHREAD_MUTEX_INITIALIZER};

static pl_fd pl_fds[PL_MAXFD];
static _Atomic unsigned char pl_tracked[PL_MAXFD]; /* lock-free test of the fast path */
static pthread_once_t pl_once = PTHREAD_ONCE_INIT;

/* ---- small helpers --------------------------------------------------------------------- */

static void pl_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void pl_say(const char *fmt, ...)
{
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "keel_powerloss: ");
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    if (real.write)
        (void)!real.write(2, buf, (size_t)n);
}

/* The simulation cannot go on (out of memory, a bad environment): a test
 * tool stops the process rather than simulate something wrong. */
static _Noreturn void pl_die(const char *what)
{
    pl_say("%s", what);
    _exit(2);
}

static void *pl_alloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        pl_die("out of memory");
    return p;
}

static uint64_t pl_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A tear choice: true = the page (size, entry, write) reached the disk. */
static bool pl_coin(uint64_t key, uint64_t n, uint64_t salt)
{
    return pl_mix(pl.seed ^ pl_mix(key ^ pl_mix(n * 8 + salt))) & 1;
}

static uint64_t pl_name_key(const char *path)
{
    const char *b = strrchr(path, '/');
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)(b ? b + 1 : path); *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return h;
}

static uint64_t pl_size(const pl_file *f)
{
    struct stat st;
    return fstat(f->priv, &st) ? 0 : (uint64_t)st.st_size;
}

static void pl_pread(int fd, unsigned char *buf, uint64_t n, uint64_t off)
{
    while (n) {
        ssize_t r = pread(fd, buf, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) { /* past the end: zeros */
            memset(buf, 0, n);
            return;
        }
        buf += r;
        off += (uint64_t)r;
        n -= (uint64_t)r;
    }
}

static bool pl_pwrite(int fd, const unsigned char *buf, uint64_t n, uint64_t off)
{
    while (n) {
        ssize_t r = real.pwrite(fd, buf, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        buf += r;
        off += (uint64_t)r;
        n -= (uint64_t)r;
    }
    return true;
}

static bool pl_is_tracked(int fd)
{
    return fd >= 0 && fd < PL_MAXFD && atomic_load_explicit(&pl_tracked[fd], memory_order_acquire);
}

/* ---- initialisation ---------------------------------------------------------------------- */

static void *pl_sym(const char *name)
{
    void *p = dlsym(RTLD_NEXT, name);
    if (!p)
        pl_say("cannot find the real %s: calls to it fail with ENOSYS", name);
    return p;
}

static uint64_t pl_env_u64(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    if (errno || *end || *v == '-') {
        pl_say("%s='%s' is not a non-negative integer", name, v);
        _exit(2);
    }
    return x;
}

/* The data directory, canonical (it may not exist yet: keel creates it). */
static void pl_resolve_dir(const char *d)
{
    char tmp[PATH_MAX], parent[PATH_MAX];
    if (strlen(d) >= sizeof tmp)
        pl_die("KEEL_POWERLOSS_DIR is too long");
    snprintf(tmp, sizeof tmp, "%s", d);
    for (size_t n = strlen(tmp); n > 1 && tmp[n - 1] == '/'; n--)
        tmp[n - 1] = 0;
    if (realpath(tmp, pl.dir)) {
        pl.dirlen = strlen(pl.dir);
        return;
    }
    char *slash = strrchr(tmp, '/');
    const char *base = slash ? slash + 1 : tmp;
    if (slash)
        *slash = 0;
    if (!realpath(slash ? (*tmp ? tmp : "/") : ".", parent))
        pl_die("KEEL_POWERLOSS_DIR: neither the directory nor its parent exists");
    if ((size_t)snprintf(pl.dir, sizeof pl.dir, "%s/%s", strcmp(parent, "/") ? parent : "", base) >= sizeof pl.dir)
        pl_die("KEEL_POWERLOSS_DIR is too long");
    pl.dirlen = strlen(pl.dir);
}

static void pl_atfork_lock(void)
{
    pthread_mutex_lock(&pl.mu);
}

static void pl_atfork_unlock(void)
{
    pthread_mutex_unlock(&pl.mu);
}

static void pl_init_once(void)
{
    real.openat = pl_sym("openat");
    real.close = pl_sym("close");
    real.dup = pl_sym("dup");
    real.dup2 = pl_sym("dup2");
    real.dup3 = pl_sym("dup3");
    real.write = pl_sym("write");
    real.pwrite = pl_sym("pwrite");
    real.writev = pl_sym("writev");
    real.pwritev = pl_sym("pwritev");
    real.pwritev2 = pl_sym("pwritev2");
    real.ftruncate = pl_sym("ftruncate");
    real.fsync = pl_sym("fsync");
    real.fdatasync = pl_sym("fdatasync");
    real.sync_file_range = pl_sym("sync_file_range");
    real.msync = pl_sym("msync");
    real.sync = pl_sym("sync");
    real.syncfs = pl_sym("syncfs");
    real.mmap = pl_sym("mmap");
    real.munmap = pl_sym("munmap");
    const char *d = getenv("KEEL_POWERLOSS_DIR");
    if (!d || !*d)
        return; /* inert: every call goes straight through */
    pl_resolve_dir(d);
    pl.cut = pl_env_u64("KEEL_POWERLOSS_CUT");
    pl.seed = pl_env_u64("KEEL_POWERLOSS_SEED");
    const char *m = getenv("KEEL_POWERLOSS_MODE");
    if (m && *m && strcmp(m, "drop") && strcmp(m, "tear")) {
        pl_say("KEEL_POWERLOSS_MODE must be drop or tear, not '%s'", m);
        _exit(2);
    }
    pl.tear = m && !strcmp(m, "tear");
    pl.verbose = getenv("KEEL_POWERLOSS_VERBOSE") != NULL;
    const char *s = getenv("KEEL_POWERLOSS_STATS");
    if (s && strlen(s) < sizeof pl.stats)
        snprintf(pl.stats, sizeof pl.stats, "%s", s);
    pthread_atfork(pl_atfork_lock, pl_atfork_unlock, pl_atfork_unlock);
    pl.on = true;
}

static void pl_init(void)
{
    pthread_once(&pl_once, pl_init_once);
}

__attribute__((constructor)) static void pl_ctor(void)
{
    pl_init();
}

/* ---- statistics ---------------------------------------------------------------------------- */

static void pl_write_stats(void)
{
    if (!pl.stats[0])
        return;
    char line[512];
    int n = snprintf(line, sizeof line,
                     "writes=%llu syncs=%llu cut=%llu mode=%s seed=%llu bytes_journaled=%llu bytes_undone=%llu "
                     "pages_dropped=%llu pages_torn=%llu inflight_pages=%llu files_removed=%llu mapped=%llu "
                     "ignored_syncs=%llu\n",
                     (unsigned long long)pl.writes, (unsigned long long)pl.syncs,
                     (unsigned long long)(pl.cut_done ? pl.cut : 0), pl.tear ? "tear" : "drop",
                     (unsigned long long)pl.seed, (unsigned long long)pl.bytes_journaled,
                     (unsigned long long)pl.bytes_undone, (unsigned long long)pl.pages_dropped,
                     (unsigned long long)pl.pages_torn, (unsigned long long)pl.inflight_pages,
                     (unsigned long long)pl.files_removed, (unsigned long long)pl.mapped,
                     (unsigned long long)pl.ignored_syncs);
    int fd = real.openat(AT_FDCWD, pl.stats, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        pl_say("cannot write KEEL_POWERLOSS_STATS %s: %s", pl.stats, strerror(errno));
        return;
    }
    (void)!real.write(fd, line, (size_t)n);
    real.fsync(fd);
    real.close(fd);
}

__attribute__((destructor)) static void pl_fini(void)
{
    if (!pl.on)
        return;
    pthread_mutex_lock(&pl.mu);
    if (!pl.cut_done)
        pl_write_stats();
    pthread_mutex_unlock(&pl.mu);
}

/* ---- the journal -------------------------------------------------------------------------- */

static void pl_entry_free(pl_entry *e)
{
    free(e->old);
    e->old = NULL;
}

/* The entry an operation changing [off, off + len) of f needs. */
static pl_entry pl_save(const pl_file *f, uint64_t off, uint64_t len)
{
    pl_entry e = {.off = off, .len = len, .old_size = pl_size(f)};
    uint64_t have = off < e.old_size ? (len < e.old_size - off ? len : e.old_size - off) : 0;
    if (have) {
        e.old = pl_alloc(have);
        pl_pread(f->priv, e.old, have, off);
    }
    return e;
}

/* The part [from, to) of e, as an entry of its own. */
static pl_entry pl_slice(const pl_entry *e, uint64_t from, uint64_t to)
{
    pl_entry s = {.off = from, .len = to - from, .old_size = e->old_size};
    uint64_t end = to < e->old_size ? to : e->old_size;
    if (from < end) {
        s.old = pl_alloc(end - from);
        memcpy(s.old, e->old + (from - e->off), end - from);
    }
    return s;
}

static void pl_push(pl_file *f, const pl_entry *e)
{
    if (f->nent == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        pl_entry *n = realloc(f->ent, cap * sizeof *n);
        if (!n)
            pl_die("out of memory");
        f->ent = n;
        f->cap = cap;
    }
    f->ent[f->nent++] = *e;
}

/* Pages [a, b) of f are durable: what the journal holds for them goes; an
 * entry that straddles the range keeps its parts outside it, in its place
 * (the order of the entries is the order to undo them in). */
static void pl_trim(pl_file *f, uint64_t a, uint64_t b)
{
    size_t n = f->nent;
    pl_entry *old = f->ent;
    f->ent = NULL;
    f->nent = f->cap = 0;
    for (size_t i = 0; i < n; i++) {
        pl_entry *e = &old[i];
        uint64_t end = e->off + e->len;
        if (end <= a || e->off >= b) {
            pl_push(f, e);
            continue;
        }
        if (e->off < a) {
            pl_entry s = pl_slice(e, e->off, a);
            pl_push(f, &s);
        }
        if (end > b) {
            pl_entry s = pl_slice(e, b, end);
            pl_push(f, &s);
        }
        pl_entry_free(e);
    }
    free(old);
}

static void pl_clear(pl_file *f)
{
    for (size_t i = 0; i < f->nent; i++)
        pl_entry_free(&f->ent[i]);
    f->nent = 0;
}

/* A barrier covered f (whole: all of it; else the bytes [a, b), widened to
 * pages): those writes, the file's size and its directory entry are durable. */
static void pl_durable(pl_file *f, bool whole, uint64_t a, uint64_t b)
{
    if (whole)
        pl_clear(f);
    else
        pl_trim(f, a & ~(PL_PAGE - 1), (b + PL_PAGE - 1) & ~(PL_PAGE - 1));
    f->durable_size = pl_size(f);
    f->dirent_durable = true;
}

/* ---- files and descriptors ------------------------------------------------------------------ */

static bool pl_under(const char *p)
{
    return !strncmp(p, pl.dir, pl.dirlen) && (p[pl.dirlen] == '/' || !p[pl.dirlen]);
}

static bool pl_fd_path(int fd, char *buf, size_t n)
{
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t r = readlink(link, buf, n - 1);
    if (r <= 0)
        return false;
    buf[r] = 0;
    return true;
}

static pl_file *pl_file_of(const struct stat *st, const char *path, bool created)
{
    for (size_t i = 0; i < pl.nfiles; i++)
        if (pl.files[i]->dev == st->st_dev && pl.files[i]->ino == st->st_ino && !pl.files[i]->removed)
            return pl.files[i];
    int priv = real.openat(AT_FDCWD, path, O_RDWR | O_CLOEXEC);
    if (priv < 0) {
        pl_say("cannot open %s to journal it (%s): its writes are not tracked", path, strerror(errno));
        return NULL;
    }
    pl_file *f = pl_alloc(sizeof *f);
    *f = (pl_file){.dev = st->st_dev, .ino = st->st_ino, .path = strdup(path), .key = pl_name_key(path),
                   .priv = priv, .durable_size = (uint64_t)st->st_size, .created = created,
                   .dirent_durable = !created};
    if (!f->path)
        pl_die("out of memory");
    if (pl.nfiles == pl.capfiles) {
        size_t cap = pl.capfiles ? pl.capfiles * 2 : 16;
        pl_file **n = realloc(pl.files, cap * sizeof *n);
        if (!n)
            pl_die("out of memory");
        pl.files = n;
        pl.capfiles = cap;
    }
    pl.files[pl.nfiles++] = f;
    return f;
}

static void pl_fd_forget(int fd)
{
    if (fd < 0 || fd >= PL_MAXFD)
        return;
    atomic_store_explicit(&pl_tracked[fd], 0, memory_order_release);
    free(pl_fds[fd].dir);
    pl_fds[fd] = (pl_fd){0};
}

/* fd was just opened (with flags; created: the open made the file): track it
 * when it names a regular file or a directory under the data directory. */
static void pl_register(int fd, int flags, bool created)
{
    char path[PATH_MAX];
    struct stat st;
    pl_fd_forget(fd);
    if (!pl_fd_path(fd, path, sizeof path) || !pl_under(path) || fstat(fd, &st))
        return;
    if (fd >= PL_MAXFD) {
        pl_say("descriptor %d of %s is past the table: its writes are not tracked", fd, path);
        return;
    }
    if (S_ISDIR(st.st_mode)) {
        pl_fds[fd].dir = strdup(path);
        if (!pl_fds[fd].dir)
            pl_die("out of memory");
    } else if (S_ISREG(st.st_mode)) {
        pl_file *f = pl_file_of(&st, path, created);
        if (!f)
            return;
        pl_fds[fd] = (pl_fd){.f = f, .dsync = flags & O_DSYNC, .append = flags & O_APPEND};
    } else {
        return;
    }
    pl_fds[fd].dev = st.st_dev;
    pl_fds[fd].ino = st.st_ino;
    atomic_store_explicit(&pl_tracked[fd], 1, memory_order_release);
}

/* Under the mutex: is fd still what we registered? A descriptor another path
 * closed (fclose of an fdopen'ed one, close_range) and the kernel reused is
 * forgotten here instead of being journaled as the old file. */
static bool pl_fd_live(int fd)
{
    struct stat st;
    if (!pl_is_tracked(fd))
        return false;
    if (!fstat(fd, &st) && st.st_dev == pl_fds[fd].dev && st.st_ino == pl_fds[fd].ino)
        return true;
    pl_fd_forget(fd);
    return false;
}

static void pl_fd_copy(int from, int to)
{
    if (to < 0 || to >= PL_MAXFD || !pl_fd_live(from))
        return;
    pl_fd_forget(to);
    pl_fds[to] = pl_fds[from];
    if (pl_fds[from].dir && !(pl_fds[to].dir = strdup(pl_fds[from].dir)))
        pl_die("out of memory");
    atomic_store_explicit(&pl_tracked[to], 1, memory_order_release);
}

/* The directory dir was fsynced: the entries of the files in it are durable. */
static void pl_dir_synced(const char *dir)
{
    size_t n = strlen(dir);
    for (size_t i = 0; i < pl.nfiles; i++) {
        pl_file *f = pl.files[i];
        if (!strncmp(f->path, dir, n) && f->path[n] == '/' && !strchr(f->path + n + 1, '/'))
            f->dirent_durable = true;
    }
}

/* ---- the cut ---------------------------------------------------------------------------------- */

static int pl_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The pages f's journal touches, sorted, each once; *n gets the count. */
static uint64_t *pl_pages(const pl_file *f, size_t *n)
{
    size_t cap = 0, k = 0;
    for (size_t i = 0; i < f->nent; i++)
        cap += (f->ent[i].off + f->ent[i].len - 1) / PL_PAGE - f->ent[i].off / PL_PAGE + 1;
    uint64_t *pg = pl_alloc(cap * sizeof *pg);
    for (size_t i = 0; i < f->nent; i++)
        for (uint64_t p = f->ent[i].off / PL_PAGE; p <= (f->ent[i].off + f->ent[i].len - 1) / PL_PAGE; p++)
            pg[k++] = p;
    qsort(pg, k, sizeof *pg, pl_cmp_u64);
    size_t u = 0;
    for (size_t i = 0; i < k; i++)
        if (!u || pg[u - 1] != pg[i])
            pg[u++] = pg[i];
    *n = u;
    return pg;
}

/* Page p of f as it was at the last barrier: its current content with every
 * journaled change undone, newest first. */
static void pl_durable_page(const pl_file *f, uint64_t p, unsigned char *buf)
{
    uint64_t a = p * PL_PAGE, b = a + PL_PAGE;
    pl_pread(f->priv, buf, PL_PAGE, a);
    for (size_t i = f->nent; i-- > 0;) {
        const pl_entry *e = &f->ent[i];
        uint64_t from = e->off > a ? e->off : a, to = e->off + e->len < b ? e->off + e->len : b;
        if (from >= to)
            continue;
        pl.bytes_undone += to - from;
        uint64_t have = to < e->old_size ? to : e->old_size; /* saved bytes end here; zeros after */
        if (from < have)
            memcpy(buf + (from - a), e->old + (from - e->off), have - from);
        if (have < from)
            have = from;
        if (have < to)
            memset(buf + (have - a), 0, to - have);
    }
}

static void pl_restore(pl_file *f)
{
    uint64_t cur = pl_size(f);
    uint64_t final = pl.tear && pl_coin(f->key, 0, PL_SALT_SIZE) ? cur : f->durable_size;
    size_t n = 0;
    uint64_t *pages = pl_pages(f, &n);
    unsigned char buf[PL_PAGE];
    for (size_t i = 0; i < n; i++) {
        if (pl.tear && pl_coin(f->key, pages[i], PL_SALT_PAGE)) {
            pl.pages_torn++; /* this one reached the disk */
            continue;
        }
        pl.pages_dropped++;
        pl_durable_page(f, pages[i], buf);
        if (pages[i] * PL_PAGE < final && !pl_pwrite(f->priv, buf, PL_PAGE, pages[i] * PL_PAGE))
            pl_say("restoring %s: %s", f->path, strerror(errno));
    }
    free(pages);
    if (pl_size(f) != final && real.ftruncate(f->priv, (off_t)final))
        pl_say("restoring the size of %s: %s", f->path, strerror(errno));
}

/* Copy n bytes at offset `at` of the data described by iov into dst. */
static void pl_iov_copy(const struct iovec *iov, int cnt, uint64_t at, uint64_t n, unsigned char *dst)
{
    for (int i = 0; i < cnt && n; i++) {
        if (at >= iov[i].iov_len) {
            at -= iov[i].iov_len;
            continue;
        }
        uint64_t k = iov[i].iov_len - at < n ? iov[i].iov_len - at : n;
        memcpy(dst, (const unsigned char *)iov[i].iov_base + at, k);
        dst += k;
        n -= k;
        at = 0;
    }
}

/* Tear mode: the call in flight reached the disk page by page, or not. */
static void pl_inflight(const pl_pending *p)
{
    pl_file *f = p->f;
    if (f->removed || f->mapped_writable)
        return;
    if (p->trunc >= 0) {
        if (pl_coin(f->key, 0, PL_SALT_INFLIGHT) && !real.ftruncate(f->priv, p->trunc))
            pl.inflight_pages++;
        return;
    }
    unsigned char buf[PL_PAGE];
    for (uint64_t pg = p->off / PL_PAGE; p->len && pg <= (p->off + p->len - 1) / PL_PAGE; pg++) {
        if (!pl_coin(f->key, pg, PL_SALT_INFLIGHT))
            continue;
        uint64_t from = pg * PL_PAGE > p->off ? pg * PL_PAGE : p->off;
        uint64_t to = (pg + 1) * PL_PAGE < p->off + p->len ? (pg + 1) * PL_PAGE : p->off + p->len;
        pl_iov_copy(p->iov, p->iovcnt, from - p->off, to - from, buf);
        if (pl_pwrite(f->priv, buf, to - from, from))
            pl.inflight_pages++;
    }
}

/* The power goes out. Called with the mutex held, which is never released:
 * no other thread's tracked call can start or be half done. */
static _Noreturn void pl_cut(const pl_pending *p)
{
    pl.cut_done = true;
    for (size_t i = 0; i < pl.nfiles; i++) {
        pl_file *f = pl.files[i];
        if (f->created && !f->dirent_durable && (!pl.tear || !pl_coin(f->key, 0, PL_SALT_DIRENT))) {
            if (unlink(f->path) && errno != ENOENT)
                pl_say("removing %s: %s", f->path, strerror(errno));
            f->removed = true;
            pl.files_removed++;
        } else if (!f->mapped_writable) {
            pl_restore(f);
        }
    }
    if (pl.tear && p)
        pl_inflight(p);
    for (size_t i = 0; i < pl.nfiles; i++)
        if (!pl.files[i]->removed)
            real.fsync(pl.files[i]->priv);
    int d = real.openat(AT_FDCWD, pl.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d >= 0) {
        real.fsync(d);
        real.close(d);
    }
    pl_write_stats();
    if (pl.verbose)
        pl_say("power cut at tracked write %llu (%s, seed %llu): %llu pages dropped, %llu kept, %llu of the call in "
               "flight written, %llu files removed",
               (unsigned long long)pl.cut, pl.tear ? "tear" : "drop", (unsigned long long)pl.seed,
               (unsigned long long)pl.pages_dropped, (unsigned long long)pl.pages_torn,
               (unsigned long long)pl.inflight_pages, (unsigned long long)pl.files_removed);
    raise(SIGKILL);
    for (;;)
        pause();
}

/* Count a tracked write call; the N-th one is the cut. */
static void pl_count(const pl_pending *p)
{
    if (++pl.writes == pl.cut && pl.cut)
        pl_cut(p);
}

/* ---- opening and closing ------------------------------------------------------------------- */

/* An O_TRUNC open of path: journal the bytes it will cut off, then open,
 * under the mutex. Returns -2 when path is not a non-empty tracked file. */
static int pl_open_truncating(int dirfd, const char *path, int flags, mode_t mode)
{
    int pre = real.openat(dirfd, path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (pre < 0)
        return -2;
    char rp[PATH_MAX];
    struct stat st;
    bool tracked = pl_fd_path(pre, rp, sizeof rp) && pl_under(rp) && !fstat(pre, &st) && S_ISREG(st.st_mode) &&
                   st.st_size > 0;
    real.close(pre);
    if (!tracked)
        return -2;
    pthread_mutex_lock(&pl.mu);
    pl_file *f = pl_file_of(&st, rp, false);
    if (!f) {
        pthread_mutex_unlock(&pl.mu);
        return -2;
    }
    pl_count(&(pl_pending){.f = f, .trunc = 0});
    uint64_t size = pl_size(f);
    pl_entry e = pl_save(f, 0, size);
    int fd = real.openat(dirfd, path, flags, mode);
    int err = errno;
    if (fd >= 0) {
        if (size)
            pl_push(f, &e);
        else
            pl_entry_free(&e);
        pl_register(fd, flags, false);
    } else {
        pl_entry_free(&e);
    }
    pthread_mutex_unlock(&pl.mu);
    errno = err;
    return fd;
}

static int pl_open(int dirfd, const char *path, int flags, mode_t mode)
{
    pl_init();
    if (!real.openat) {
        errno = ENOSYS;
        return -1;
    }
    if (!pl.on)
        return real.openat(dirfd, path, flags, mode);
    struct stat st;
    bool existed = !(flags & O_CREAT) || !fstatat(dirfd, path, &st, 0);
    if ((flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY && existed) {
        int fd = pl_open_truncating(dirfd, path, flags, mode);
        if (fd != -2)
            return fd;
    }
    int fd = real.openat(dirfd, path, flags, mode);
    if (fd >= 0) {
        int err = errno;
        pthread_mutex_lock(&pl.mu);
        pl_register(fd, flags, !existed);
        pthread_mutex_unlock(&pl.mu);
        errno = err;
    }
    return fd;
}

static mode_t pl_mode(int flags, va_list ap)
{
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = pl_mode(flags, ap);
    va_end(ap);
    return pl_open(AT_FDCWD, path, flags, mode);
}

int open64(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = pl_mode(flags, ap);
    va_end(ap);
    return pl_open(AT_FDCWD, path, flags | O_LARGEFILE, mode);
}

int openat(int dirfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = pl_mode(flags, ap);
    va_end(ap);
    return pl_open(dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = pl_mode(flags, ap);
    va_end(ap);
    return pl_open(dirfd, path, flags | O_LARGEFILE, mode);
}

int __open_2(const char *path, int flags)
{
    return pl_open(AT_FDCWD, path, flags, 0);
}

int __open64_2(const char *path, int flags)
{
    return pl_open(AT_FDCWD, path, flags | O_LARGEFILE, 0);
}

int __openat_2(int dirfd, const char *path, int flags)
{
    return pl_open(dirfd, path, flags, 0);
}

int __openat64_2(int dirfd, const char *path, int flags)
{
    return pl_open(dirfd, path, flags | O_LARGEFILE, 0);
}

int creat(const char *path, mode_t mode)
{
    return pl_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

int creat64(const char *path, mode_t mode)
{
    return pl_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC | O_LARGEFILE, mode);
}

/* The journal outlives the descriptor: closing does not make writes durable. */
int close(int fd)
{
    pl_init();
    if (!pl_is_tracked(fd))
        return real.close(fd);
    pthread_mutex_lock(&pl.mu);
    pl_fd_forget(fd);
    int r = real.close(fd);
    int err = errno;
    pthread_mutex_unlock(&pl.mu);
    errno = err;
    return r;
}

int dup(int fd)
{
    pl_init();
    if (!pl.on)
        return real.dup(fd);
    pthread_mutex_lock(&pl.mu);
    int r = real.dup(fd);
    int err = errno;
    pl_fd_forget(r);
    if (r >= 0)
        pl_fd_copy(fd, r);
    pthread_mutex_unlock(&pl.mu);
    errno = err;
    return r;
}

static int pl_dup_onto(int from, int to, int flags, bool three)
{
    pl_init();
    if (!pl.on)
        return three ? real.dup3(from, to, flags) : real.dup2(from, to);
    pthread_mutex_lock(&pl.mu);
    int r = three ? real.dup3(from, to, flags) : real.dup2(from, to);
    int err = errno;
    if (r >= 0 && from != to) {
        pl_fd_forget(to);
        pl_fd_copy(from, to);
    }
    pthread_mutex_unlock(&pl.mu);
    errno = err;
    return r;
}

int dup2(int from, int to)
{
    return pl_dup_onto(from, to, 0, false);
}

int dup3(int from, int to, int flags)
{
    return pl_dup_onto(from, to, flags, true);
}

/* ---- writing ---------------------------------------------------------------------------------- */

typedef enum pl_kind { PL_WRITE, PL_PWRITE, PL_WRITEV, PL_PWRITEV, PL_PWRITEV2 } pl_kind;

typedef struct pl_call {
    pl_kind kind;
    int fd;
    const struct iovec *iov;
    int iovcnt;
    off_t off;               /* PL_PWRITE*, -1 for PL_PWRITEV2: the current position */
    int rwf;                 /* PL_PWRITEV2 */
} pl_call;

static ssize_t pl_call_real(const pl_call *c)
{
    switch (c->kind) {
    case PL_WRITE:
        return real.write(c->fd, c->iov[0].iov_base, c->iov[0].iov_len);
    case PL_PWRITE:
        return real.pwrite(c->fd, c->iov[0].iov_base, c->iov[0].iov_len, c->off);
    case PL_WRITEV:
        return real.writev(c->fd, c->iov, c->iovcnt);
    case PL_PWRITEV:
        return real.pwritev(c->fd, c->iov, c->iovcnt, c->off);
    case PL_PWRITEV2:
        if (!real.pwritev2) {
            errno = ENOSYS;
            return -1;
        }
        return real.pwritev2(c->fd, c->iov, c->iovcnt, c->off, c->rwf);
    }
    errno = EINVAL;
    return -1;
}

/* A write to a tracked descriptor: journal the range, write, keep the entry
 * for what was written (or nothing: the write was durable when it returned). */
static ssize_t pl_write(const pl_call *c)
{
    pthread_mutex_lock(&pl.mu);
    pl_fd *d = &pl_fds[c->fd];
    pl_file *f = pl_fd_live(c->fd) ? d->f : NULL;
    if (!f) { /* a directory, or closed meanwhile */
        pthread_mutex_unlock(&pl.mu);
        return pl_call_real(c);
    }
    uint64_t len = 0;
    for (int i = 0; i < c->iovcnt; i++)
        len += c->iov[i].iov_len;
    bool positioned = c->kind == PL_PWRITE || c->kind == PL_PWRITEV || (c->kind == PL_PWRITEV2 && c->off != -1);
    uint64_t off = d->append ? pl_size(f) : positioned ? (uint64_t)c->off : (uint64_t)lseek(c->fd, 0, SEEK_CUR);
    pl_count(&(pl_pending){.f = f, .off = off, .len = len, .iov = c->iov, .iovcnt = c->iovcnt, .trunc = -1});
    bool sync = d->dsync || (c->kind == PL_PWRITEV2 && (c->rwf & (RWF_DSYNC | RWF_SYNC)));
    pl_entry e = {0};
    if (!sync && len)
        e = pl_save(f, off, len);
    ssize_t r = pl_call_real(c);
    int err = errno;
    if (r > 0 && sync) {
        pl_durable(f, false, off, off + (uint64_t)r);
        pl.syncs++;
    } else if (r > 0) {
        if ((uint64_t)r < e.len) /* a short write: the rest of the range did not change */
            e.len = (uint64_t)r;
        pl_push(f, &e);
        pl.bytes_journaled += (uint64_t)r;
        e.old = NULL;
    }
    pl_entry_free(&e);
    pthread_mutex_unlock(&pl.mu);
    errno = err;
    return r;
}

ssize_t write(int fd, const void *buf, size_t n)
{
    pl_init();
    if (!pl_is_tracked(fd))
        return real.write(fd, buf, n);
    struct iovec v = {(void *)buf, n};
    return pl_write(&(pl_call){PL_WRITE, fd, &v, 1, 0, 0});
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
    pl_init();
    if (!pl_is_tracked(fd))
        return real.pwrite(fd, buf, n, off);
    struct iovec v = {(void *)buf, n};
    return pl_write(&(pl_call){PL_PWRITE, fd, &v, 1, off, 0});
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off)
{
    return pwrite(fd, buf, n, off);
}

ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
    pl_init();
    if (!pl_is_tracked(fd) || cnt < 0)
        return real.writev(fd, iov, cnt);
    return pl_write(&(pl_call){PL_WRITEV, fd, iov, cnt, 0, 0});
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off)
{
    pl_init();
    if (!pl_is_tracked(fd) || cnt < 0)
        return real.pwritev(fd, iov, cnt, off);
    return pl_write(&(pl_call){PL_PWRITEV, fd, iov, cnt, off, 0});
}

ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off_t off)
{
    return pwritev(fd, iov, cnt, off);
}

ssize_t pwritev2(int fd, const struct iovec *iov, int cnt, off_t off, int flags)
{
    pl_init();
    if (!pl_is_tracked(fd) || cnt < 0) {
        if (!real.pwritev2) {
            errno = ENOSYS;
            return -1;
        }
        return real.pwritev2(fd, iov, cnt, off, flags);
    }
    return pl_write(&(pl_call){PL_PWRITEV2, fd, iov, cnt, off, flags});
}

ssize_t pwritev64v2(int fd, const struct iovec *iov, int cnt, off_t off, int flags)
{
    return pwritev2(fd, iov, cnt, off, flags);
}

int ftruncate(int fd, off_t length)
{
    pl_init();
    if (!pl_is_tracked(fd) || length < 0)
        return real.ftruncate(fd, length);
    pthread_mutex_lock(&pl.mu);
    pl_file *f = pl_fd_live(fd) ? pl_fds[fd].f : NULL;
    if (!f) {
        pthread_mutex_unlock(&pl.mu);
        return real.ftruncate(fd, length);
    }
    pl_count(&(pl_pending){.f = f, .trunc = length});
    uint64_t size = pl_size(f), len = (uint64_t)length;
    pl_entry e = len < size ? pl_save(f, len, size - len) : (pl_entry){.off = size, .len = len - size, .old_size = size};
    int r = real.ftruncate(fd, length);
    int err = errno;
    if (!r && len != size) {
        pl_push(f, &e);
        e.old = NULL;
    }
    pl_entry_free(&e);
    pthread_mutex_unlock(&pl.mu);
    errno = err;
    return r;
}

int ftruncate64(int fd, off_t length)
{
    return ftruncate(fd, length);
}

/* ---- barriers ---------------------------------------------------------------------------------- */

static int pl_sync_fd(int fd, bool data)
{
    pl_init();
    if (!pl_is_tracked(fd))
        return data ? real.fdatasync(fd) : real.fsync(fd);
    pthread_mutex_lock(&pl.mu);
    int r = data ? real.fdatasync(fd) : real.fsync(fd);
    int err = errno;
    if (!r && pl_fd_live(fd)) {
        if (pl_fds[fd].f)
            pl_durable(pl_fds[fd].f, true, 0, 0);
        else if (pl_fds[fd].dir)
            pl_dir_synced(pl_fds[fd].dir);
        pl.syncs++;
    }
    pthread_mutex_unlock(&pl.mu);
    errno = err;
    return r;
}

int fsync(int fd)
{
    return pl_sync_fd(fd, false);
}

int fdatasync(int fd)
{
    return pl_sync_fd(fd, true);
}

/* Not a barrier (it flushes neither the disk's cache nor the metadata that
 * finds the data): counted, nothing becomes durable. */
int sync_file_range(int fd, off_t off, off_t n, unsigned int flags)
{
    pl_init();
    if (pl_is_tracked(fd)) {
        pthread_mutex_lock(&pl.mu);
        pl.ignored_syncs++;
        pthread_mutex_unlock(&pl.mu);
    }
    return real.sync_file_range(fd, off, n, flags);
}

void sync(void)
{
    pl_init();
    if (!pl.on) {
        real.sync();
        return;
    }
    pthread_mutex_lock(&pl.mu);
    real.sync();
    for (size_t i = 0; i < pl.nfiles; i++)
        if (!pl.files[i]->removed)
            pl_durable(pl.files[i], true, 0, 0);
    pl.syncs++;
    pthread_mutex_unlock(&pl.mu);
}

int syncfs(int fd)
{
    pl_init();
    if (!pl.on)
        return real.syncfs(fd);
    pthread_mutex_lock(&pl.mu);
    int r = real.syncfs(fd);
    int err = errno;
    struct stat st;
    if (!r && !fstat(fd, &st)) {
        for (size_t i = 0; i < pl.nfiles; i++)
            if (pl.files[i]->dev == st.st_dev && !pl.files[i]->removed)
                pl_durable(pl.files[i], true, 0, 0);
        pl.syncs++;
    }
    pthread_mutex_unlock(&pl.mu);
    errno = err;
    return r;
}

/* Mappings of tracked files, by address; a new mapping replaces whatever the
 * kernel had at its addresses. */
static void pl_maps_forget(uintptr_t a, size_t len)
{
    size_t k = 0;
    for (size_t i = 0; i < pl.nmaps; i++)
        if (pl.maps[i].addr + pl.maps[i].len <= a || pl.maps[i].addr >= a + len)
            pl.maps[k++] = pl.maps[i];
    pl.nmaps = k;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    pl_init();
    void *r = real.mmap(addr, len, prot, flags, fd, off);
    if (r == MAP_FAILED || !pl.on)
        return r;
    int err = errno;
    pthread_mutex_lock(&pl.mu);
    pl_maps_forget((uintptr_t)r, len);
    pl_file *f = pl_fd_live(fd) ? pl_fds[fd].f : NULL;
    if (f && (flags & MAP_SHARED)) {
        if (pl.nmaps == pl.capmaps) {
            size_t cap = pl.capmaps ? pl.capmaps * 2 : 16;
            pl_map *n = realloc(pl.maps, cap * sizeof *n);
            if (!n)
                pl_die("out of memory");
            pl.maps = n;
            pl.capmaps = cap;
        }
        pl.maps[pl.nmaps++] = (pl_map){(uintptr_t)r, len, f, (uint64_t)off};
        if ((prot & PROT_WRITE) && !f->mapped_writable) {
            f->mapped_writable = true;
            pl.mapped++;
            if (pl.verbose)
                pl_say("%s is mapped shared and writable: writes through the map cannot be undone; the cut leaves "
                       "the file as it is",
                       f->path);
        }
    }
    pthread_mutex_unlock(&pl.mu);
    errno = err;
    return r;
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    return mmap(addr, len, prot, flags, fd, off);
}

int munmap(void *addr, size_t len)
{
    pl_init();
    int r = real.munmap(addr, len);
    if (!r && pl.on) {
        pthread_mutex_lock(&pl.mu);
        pl_maps_forget((uintptr_t)addr, len); /* a partly unmapped mapping is forgotten whole: msync then covers less */
        pthread_mutex_unlock(&pl.mu);
    }
    return r;
}

int msync(void *addr, size_t len, int flags)
{
    pl_init();
    if (!pl.on || !(flags & MS_SYNC))
        return real.msync(addr, len, flags);
    pthread_mutex_lock(&pl.mu);
    int r = real.msync(addr, len, flags);
    int err = errno;
    uintptr_t a = (uintptr_t)addr, b = a + len;
    for (size_t i = 0; !r && i < pl.nmaps; i++) {
        pl_map *m = &pl.maps[i];
        uintptr_t from = m->addr > a ? m->addr : a, to = m->addr + m->len < b ? m->addr + m->len : b;
        if (from >= to)
            continue;
        pl_durable(m->f, false, m->off + (from - m->addr), m->off + (to - m->addr));
        pl.syncs++;
    }
    pthread_mutex_unlock(&pl.mu);
    errno = err;
    return r;
}
