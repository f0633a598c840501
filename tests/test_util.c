/*
 * test_util.c -- temporary directories, tools run as child processes and
 * WAL records on disk, for the test programs that list this file in
 * tests/CMakeLists.txt (test_util.h says what each helper does).
 */
#include "test_util.h"

#include <check.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "keel_test.h"
#include "keel_wal/wal.h"

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

tu_run tu_run_argv(const char *bin, const char *const *args)
{
    const char *argv[64] = {bin};
    int n = 1;
    for (; args[n - 1]; n++) {
        ck_assert_int_lt(n, 63);
        argv[n] = args[n - 1];
    }
    argv[n] = NULL;
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

int tu_wait(pid_t pid)
{
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- WAL records on disk ------------------------------------------------------------------- */

void *tu_record_copy(const char *dir, uint64_t lsn, size_t *len)
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
    uint64_t lsn;
    const void *rec;
    size_t len;
} tu_put;

static int tu_fill_put(kw_wtxn *t, void *arg)
{
    const tu_put *p = arg;
    unsigned char key[8]; /* the WAL's keys: big-endian LSNs */
    for (int i = 0; i < 8; i++)
        key[i] = (unsigned char)(p->lsn >> (56 - 8 * i));
    return kw_put(t, KW_DB_WAL, key, sizeof key, p->rec, p->len);
}

void tu_wal_put(const char *dir, uint64_t lsn, const void *rec, size_t len)
{
    kw_store *st = NULL;
    kw_store_desc sd = {0};
    ck_assert_ok(kw_store_open(dir, &sd, &st));
    tu_put p = {lsn, rec, len};
    ck_assert_ok(kw_store_write(st, tu_fill_put, &p));
    kw_store_close(st);
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
