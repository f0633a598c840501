/*
 * tools/keel-wal/common.c -- what every keel-wal subcommand shares: error
 * sentences and exit codes, option parsing, entity handles, opening a data
 * directory read-only with its schema and checkpoint pointer, JSON values
 * decoded through the stored schema, and TTY-only progress.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kwt.h"
#include "keel_repl/repl.h"
#include "keel/component.h"

/* ---- errors and arguments ------------------------------------------------------ */

void kwt_err(const char *what, const char *fmt, ...)
{
    va_list ap;
    fflush(stdout); /* keep stdout's lines before the error when both go to one terminal */
    fprintf(stderr, "keel-wal: %s: ", what);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int kwt_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "keel-wal %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (try 'keel-wal %s --help')\n", cmd);
    return KWT_EXIT_USAGE;
}

bool kwt_help_requested(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return true;
    return false;
}

int kwt_print_help(const char *text)
{
    fputs(text, stdout);
    return KWT_EXIT_OK;
}

bool kwt_parse_u64(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-' || *s == '+' || *s == ' ')
        return false;
    int base = s[0] == '0' && (s[1] == 'x' || s[1] == 'X') ? 16 : 10;
    if (base == 16 && !s[2])
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, base);
    if (errno || *end)
        return false;
    *out = v;
    return true;
}

int kwt_opt(const char *cmd, int argc, char **argv, int *i, const char *name, const char **val)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n))
        return 0;
    if (a[n] == '=') {
        *val = a + n + 1;
        return 1;
    }
    if (a[n])
        return 0;
    if (*i + 1 >= argc) {
        kwt_usage_error(cmd, "%s needs a value", name);
        return -1;
    }
    *val = argv[++*i];
    return 1;
}

int kwt_opt_u64(const char *cmd, int argc, char **argv, int *i, const char *name, uint64_t *val)
{
    const char *s;
    int rc = kwt_opt(cmd, argc, argv, i, name, &s);
    if (rc <= 0)
        return rc;
    if (!kwt_parse_u64(s, val)) {
        kwt_usage_error(cmd, "%s wants an unsigned number, not '%s'", name, s);
        return -1;
    }
    return 1;
}

bool kwt_output_broken(void)
{
    return ferror(stdout) != 0;
}

/* The reader of a pipe went away: Linux reports POLLERR on its write end. */
bool kwt_output_reader_gone(void)
{
    struct pollfd p = {.fd = STDOUT_FILENO, .events = POLLOUT};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLERR);
}

int kwt_output_finish(int rc)
{
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout))
        return rc;
    int e = errno;
    if (e == EPIPE || kwt_output_reader_gone())
        return rc;
    kwt_err("stdout", "write error: %s", e ? strerror(e) : "the output could not be written");
    return KWT_EXIT_USAGE;
}

int kwt_arg_dir(const char *cmd, const char *arg, const char **dir)
{
    if (arg[0] == '-')
        return kwt_usage_error(cmd, "unknown option '%s'", arg);
    if (*dir)
        return kwt_usage_error(cmd, "one directory only ('%s' and '%s')", *dir, arg);
    *dir = arg;
    return KWT_EXIT_OK;
}

int kwt_need_dir(const char *cmd, const char *dir)
{
    return dir ? KWT_EXIT_OK : kwt_usage_error(cmd, "give the data directory");
}

/* ---- fault guard ------------------------------------------------------------------ */

static char guard_msg[4400];
static size_t guard_len;
static int guard_code = KWT_EXIT_USAGE;

static void guard_handler(int sig)
{
    (void)sig;
    if (guard_len && write(STDERR_FILENO, guard_msg, guard_len) < 0)
        guard_len = 0;
    _exit(guard_code);
}

void kwt_guard_set(const char *dir, int code)
{
    static bool installed;
    guard_code = code;
    if (dir)
        guard_len = (size_t)snprintf(guard_msg, sizeof guard_msg,
                                     "keel-wal: %s/data.mdb: the LMDB file is damaged (reading it faulted)\n", dir);
    if (guard_len >= sizeof guard_msg)
        guard_len = sizeof guard_msg - 1;
    if (!installed) {
        struct sigaction sa = {.sa_handler = guard_handler};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, NULL);
        sigaction(SIGBUS, &sa, NULL);
        installed = true;
    }
}

/* ---- entity handles --------------------------------------------------------------- */

static bool all_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f') || (s[i] >= 'A' && s[i] <= 'F')))
            return false;
    return true;
}

static bool parse_u32_dec(const char *s, size_t n, uint32_t *out)
{
    uint64_t v = 0;
    if (!n || n > 10)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > UINT32_MAX)
        return false;
    *out = (uint32_t)v;
    return true;
}

bool kwt_parse_entity(const char *s, uint64_t *out)
{
    if (!s)
        return false;
    size_t n = strlen(s);
    const char *colon = strchr(s, ':');
    if (colon) {
        uint32_t index, gen;
        if (!parse_u32_dec(s, (size_t)(colon - s), &index) || !parse_u32_dec(colon + 1, strlen(colon + 1), &gen))
            return false;
        *out = (uint64_t)gen << 32 | index;
        return true;
    }
    if (n > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        s += 2;
        n -= 2;
    } else if (n != 16) {
        return false;
    }
    if (!n || n > 16 || !all_hex(s, n))
        return false;
    *out = strtoull(s, NULL, 16);
    return true;
}

const char *kwt_format_entity(uint64_t e, char buf[17])
{
    snprintf(buf, 17, "%016" PRIx64, e);
    return buf;
}

static bool out_of_memory_noted;

void kwt_note_out_of_memory(void)
{
    out_of_memory_noted = true;
}

bool kwt_out_of_memory(void)
{
    return out_of_memory_noted || kw_out_of_memory_seen();
}

/* ---- the data directory ----------------------------------------------------------- */

/* Load the stored schema. A schema that is unreadable is described in
 * schema_error for the subcommand to report; running out of memory is
 * returned (KEEL_ENOMEM): the schema may be fine, and a command that went
 * on without it would print less than the directory holds. */
static int load_schema(kwt_dir *d, kw_rtxn *r)
{
    const void *rec, *payload;
    size_t len;
    kw_header h;
    int rc = kw_get(r, KW_DB_SCHEMA, KW_SCHEMA_KEY, strlen(KW_SCHEMA_KEY), &rec, &len);
    if (rc == KEEL_ENOENT)
        return KEEL_OK;
    if (!rc && !(rc = kw_record_check(rec, len, &h)) && h.kind != KW_KIND_SCHEMA)
        rc = KEEL_ECORRUPT, snprintf(d->schema_error, sizeof d->schema_error,
                                     "schema/\"components\" holds a %s record, not a schema", kw_kind_name(h.kind));
    if (!rc)
        rc = kw_record_payload(d->codec, rec, &h, &payload);
    if (!rc)
        rc = kw_schema_decode(payload, h.raw_len, &d->schema);
    if (rc == KEEL_ENOMEM)
        return rc;
    if (rc && !d->schema_error[0])
        snprintf(d->schema_error, sizeof d->schema_error, "the stored schema is unreadable: %s", keel_last_error());
    d->has_schema = !rc;
    return KEEL_OK;
}

/* Load the checkpoint pointer; as load_schema. */
static int load_checkpoint(kwt_dir *d, kw_rtxn *r)
{
    const void *v;
    size_t n;
    d->replicated = !kw_get(r, KW_DB_META, KW_META_REPLICATED, strlen(KW_META_REPLICATED), &v, &n);
    if (d->replicated) {
        n = n < sizeof d->stream_name ? n : sizeof d->stream_name - 1;
        memcpy(d->stream_name, v, n);
        d->stream_name[n] = 0;
    }
    int rc = kw_get(r, KW_DB_META, KW_META_CHECKPOINT, strlen(KW_META_CHECKPOINT), &v, &n);
    if (rc == KEEL_ENOENT)
        return KEEL_OK;
    if (!rc)
        rc = kw_checkpoint_meta_decode(v, n, &d->checkpoint);
    if (rc == KEEL_ENOMEM)
        return rc;
    if (rc)
        snprintf(d->checkpoint_error, sizeof d->checkpoint_error, "meta \"checkpoint\" is unreadable: %s",
                 keel_last_error());
    d->has_checkpoint = !rc;
    return KEEL_OK;
}

/* The store of `path` refused: its sentence without the leading path
 * ("DIR/data.mdb is damaged" reads "keel-wal: DIR: data.mdb is damaged",
 * "DIR is not ..." reads "keel-wal: DIR: is not ..."); `exit` returned. */
static int refused(const char *path, int exit)
{
    const char *why = keel_last_error();
    size_t n = strlen(path);
    if (!strncmp(why, path, n) && (why[n] == '/' || why[n] == ' '))
        why += n + 1;
    kwt_err(path, "%s", why);
    return exit;
}

/* A check's damage is a problem found, like verify's: exit 1. */
static int checked(const char *path, int rc)
{
    return rc ? refused(path, rc == KEEL_ECORRUPT ? KWT_EXIT_PROBLEM : KWT_EXIT_USAGE) : KWT_EXIT_OK;
}

/* Precise causes for the common cases before LMDB is involved. */
static int precheck(const char *path)
{
    struct stat st;
    char p[4200];
    if (stat(path, &st)) {
        kwt_err(path, "cannot open the data directory: %s", strerror(errno));
        return KWT_EXIT_USAGE;
    }
    if (!S_ISDIR(st.st_mode)) {
        kwt_err(path, "not a directory (give the data directory, the one holding data.mdb)");
        return KWT_EXIT_USAGE;
    }
    snprintf(p, sizeof p, "%s/data.mdb", path);
    if (stat(p, &st)) {
        kwt_err(path, "not a keel data directory: no data.mdb (%s)", strerror(errno));
        return KWT_EXIT_USAGE;
    }
    /* a damaged data.mdb (empty, truncated, a bad meta page) is a problem
     * found, like verify's: exit 1, before LMDB maps it */
    return checked(path, kw_store_check_file(path));
}

bool kwt_is_stream(const char *path)
{
    return !strncmp(path, "nats://", 7);
}

/* ---- what a signal removes: a stream's private copy, a backup's DEST ---------------------------

A command on a stream reads a private copy of it in $TMPDIR, removed when
the command ends -- also when a signal ends it: from the copy's creation
SIGINT, SIGTERM and SIGHUP (those not ignored) remove its files (unlink and
rmdir are async-signal-safe; the paths are made before the handler is
armed) and then end the process by the same signal, as it would have
without the handler. A backup (and a restore's copy into DEST) is removed
the same way while it runs: what kw_store_backup says it made in DEST, and
DEST when it made it (kw_backup_unmake).
tail -f puts its own SIGINT/SIGTERM handlers (a clean stop) in front while
it follows. One copy and one backup per process. */
static const char *const copy_names[] = {"data.mdb", "lock.mdb", "keel.lock", "data.mdb.new",
                                         "data.mdb.new-lock"}; /* the last two: while the store is made */
#define COPY_NFILES (sizeof copy_names / sizeof copy_names[0])
static char copy_paths[COPY_NFILES + 1][4200]; /* the files, then the directory */
static volatile sig_atomic_t copy_armed;
static kw_backup_made backup_made;               /* kw_store_backup's record, while it runs */
static volatile sig_atomic_t backup_armed;

static void copy_paths_set(const char *dir)
{
    for (size_t i = 0; i < COPY_NFILES; i++)
        snprintf(copy_paths[i], sizeof copy_paths[i], "%s/%s", dir, copy_names[i]);
    snprintf(copy_paths[COPY_NFILES], sizeof copy_paths[COPY_NFILES], "%s", dir);
}

static void copy_unlink(void)
{
    for (size_t i = 0; i < COPY_NFILES; i++)
        unlink(copy_paths[i]);
    rmdir(copy_paths[COPY_NFILES]);
}

static void cleanup_signal(int sig)
{
    int saved = errno; /* the signal stays blocked until this returns: what it interrupted sees errno unchanged */
    if (backup_armed) /* first: DEST may be made from the copy (restore) */
        kw_backup_unmake(&backup_made);
    if (copy_armed)
        copy_unlink();
    raise(sig); /* SA_RESETHAND: delivered with the default action once this returns */
    errno = saved;
}

static void cleanup_arm(void)
{
    struct sigaction sa = {.sa_handler = cleanup_signal, .sa_flags = SA_RESETHAND};
    sigemptyset(&sa.sa_mask);
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaddset(&sa.sa_mask, sigs[i]);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old;
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN) /* nohup, a background job */
            sigaction(sigs[i], &sa, NULL);
    }
}

static void copy_arm(const char *dir)
{
    copy_armed = 0;
    copy_paths_set(dir);
    cleanup_arm();
    copy_armed = 1;
}

/* kw_store_backup's record of what it makes, armed from the claim of DEST until it returns. */
static void backup_arm(const kw_backup_made *m, void *arg)
{
    (void)arg;
    backup_armed = 0;
    if (!m)
        return;
    backup_made = *m;
    cleanup_arm();
    backup_armed = 1;
}

int kwt_backup(const char *dir, const char *dest)
{
    return kw_store_backup(&(kw_backup_desc){.dir = dir, .dest = dest, .made = backup_arm});
}

void kwt_remove_copy(const char *dir)
{
    if (!copy_armed || strcmp(dir, copy_paths[COPY_NFILES])) { /* not the armed copy: never rewrite its paths */
        copy_armed = 0;
        copy_paths_set(dir);
    }
    copy_unlink(); /* a signal meanwhile only removes the same files */
    copy_armed = 0;
}

int kwt_dir_refresh(kwt_dir *d)
{
    if (!d->stream)
        return KWT_EXIT_OK;
    kr_sync_info si;
    int rc = kr_sync_whole(d->stream, d->store, &si);
    if (rc) /* a stream whose content is damaged (a gap, a message that is no record) is a problem found */
        kwt_err(d->path, "%s", keel_last_error());
    return !rc ? KWT_EXIT_OK : rc == KEEL_ECORRUPT ? KWT_EXIT_PROBLEM : KWT_EXIT_USAGE;
}

/* A stream address: connect, copy the stream into a private directory and
 * keep that open (writable: tail -f copies more into it). */
static int open_stream(const char *path, kwt_dir *d)
{
    char urls[1024], world[KR_WORLD_MAX + 1];
    if (!kr_parse_address(path, urls, sizeof urls, world, sizeof world)) {
        kwt_err(path, "a stream address is nats://HOST:PORT/WORLD (WORLD: letters, digits, '-', '_')");
        return KWT_EXIT_USAGE;
    }
    if (kr_connect(&(kr_desc){.urls = urls, .world = world}, &d->stream)) {
        kwt_err(path, "%s", keel_last_error());
        return KWT_EXIT_USAGE;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(d->copy, sizeof d->copy, "%s/keel-wal-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(d->copy)) {
        kwt_err(path, "cannot create a private copy of the stream under %s: %s", tmp && *tmp ? tmp : "/tmp",
                strerror(errno));
        d->copy[0] = 0;
        kwt_dir_close(d);
        return KWT_EXIT_USAGE;
    }
    copy_arm(d->copy);
    kw_store_desc desc = {.flags = KW_OPEN_CREATE};
    if (kw_store_open(d->copy, &desc, &d->store)) {
        kwt_err(path, "%s", keel_last_error());
        kwt_dir_close(d);
        return KWT_EXIT_USAGE;
    }
    int rc = kwt_dir_refresh(d);
    if (rc)
        kwt_dir_close(d);
    return rc;
}

static int open_loaded(const char *path, kwt_dir *d);

static int dir_open(const char *path, uint32_t flags, kwt_dir *d);

int kwt_dir_open(const char *path, kwt_dir *d)
{
    return dir_open(path, KW_OPEN_READONLY, d);
}

int kwt_dir_open_still(const char *path, kwt_dir *d)
{
    return dir_open(path, KW_OPEN_READONLY | KW_OPEN_NOLOCK, d);
}

static int dir_open(const char *path, uint32_t flags, kwt_dir *d)
{
    memset(d, 0, sizeof *d);
    d->path = path;
    if (!*path || strlen(path) >= 4000) {
        kwt_err(*path ? "keel-wal" : "''", "the directory name is %s", *path ? "too long" : "empty");
        return KWT_EXIT_USAGE;
    }
    if (kwt_is_stream(path)) {
        int rc = open_stream(path, d);
        return rc ? rc : open_loaded(path, d);
    }
    int rc = precheck(path);
    if (rc)
        return rc;
    kwt_guard_set(path, KWT_EXIT_USAGE);
    kw_store_desc desc = {.flags = flags | KW_OPEN_TREES_LATER};
    if (kw_store_open(path, &desc, &d->store))
        return refused(path, KWT_EXIT_USAGE);
    if ((rc = checked(path, kw_store_check_trees(d->store)))) {
        kwt_dir_close(d);
        return rc;
    }
    return open_loaded(path, d);
}

/* The store is open: the codec, the schema and the checkpoint pointer. */
static int open_loaded(const char *path, kwt_dir *d)
{
    int rc;
    if ((rc = kw_codec_create(NULL, &d->codec))) {
        kwt_err(path, "%s", keel_last_error());
        kwt_dir_close(d);
        return KWT_EXIT_USAGE;
    }
    kw_rtxn *r;
    if ((rc = kwt_read_begin(d, &r))) {
        kwt_dir_close(d);
        return rc;
    }
    rc = load_schema(d, r);
    rc = rc ? rc : load_checkpoint(d, r);
    kw_read_end(r);
    if (rc) {
        kwt_err(path, "%s", keel_last_error());
        kwt_dir_close(d);
        return KWT_EXIT_USAGE;
    }
    return KWT_EXIT_OK;
}

void kwt_dir_close(kwt_dir *d)
{
    if (d->has_schema)
        kw_schema_free(&d->schema);
    kw_codec_destroy(d->codec);
    kw_store_close(d->store);
    kr_close(d->stream);
    if (d->copy[0])
        kwt_remove_copy(d->copy);
    memset(d, 0, sizeof *d);
}

int kwt_run_on_dir(int argc, char **argv, const char *help, kwt_parse_fn parse, void *opts, const char *const *dir,
                   kwt_body_fn body)
{
    if (kwt_help_requested(argc, argv))
        return kwt_print_help(help);
    int rc = parse(argc, argv, opts);
    if (rc)
        return rc;
    kwt_dir d;
    if ((rc = kwt_dir_open(*dir, &d)))
        return rc;
    rc = body(&d, opts);
    kwt_dir_close(&d);
    return kwt_output_finish(rc);
}

int kwt_read_begin(kwt_dir *d, kw_rtxn **out)
{
    if (kw_read_begin(d->store, out)) {
        kwt_err(d->path, "%s", keel_last_error());
        return KWT_EXIT_USAGE;
    }
    return KWT_EXIT_OK;
}

int kwt_payload(kwt_dir *d, const kw_record *r, const void **payload)
{
    return kw_record_payload(d->codec, r->rec, &r->h, payload);
}

int kwt_scan_next(kw_scan *s, kw_record *out)
{
    out->rec = NULL;
    out->len = 0;
    int rc = kw_scan_next(s, out);
    if (rc >= 0)
        return rc;
    /* kw_scan_next fills rec only when it got a record to check */
    return out->rec ? KWT_SCAN_INVALID : rc;
}

const char *kwt_comp_name(const kwt_dir *d, uint32_t id, char buf[16])
{
    const kw_component *c = d->has_schema ? kw_schema_get(&d->schema, id) : NULL;
    if (c)
        return c->name;
    snprintf(buf, 16, "#%u", id);
    return buf;
}

uint32_t kwt_comp_find(const kwt_dir *d, const char *name)
{
    for (uint32_t i = 0; d->has_schema && i < d->schema.ncomps; i++)
        if (!strcmp(d->schema.comps[i].name, name))
            return d->schema.comps[i].id;
    return 0;
}

const char *kwt_type_name(uint32_t type)
{
    return kw_scalar_name(type);
}

uint32_t kwt_type_size(uint32_t type)
{
    return kw_scalar_width(type);
}

const char *kwt_discipline_name(uint32_t discipline)
{
    return kw_discipline_name(discipline);
}

/* ---- JSON output --------------------------------------------------------------- */

void kwt_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

void kwt_json_entity(FILE *f, uint64_t e)
{
    fprintf(f, "\"%016" PRIx64 "\"", e);
}

void kwt_json_hex(FILE *f, const void *p, size_t n)
{
    const unsigned char *b = p;
    fputc('"', f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%02x", b[i]);
    fputc('"', f);
}

static void json_float(FILE *f, double v, int digits)
{
    if (isnan(v))
        fputs("\"nan\"", f);
    else if (isinf(v))
        fputs(v < 0 ? "\"-inf\"" : "\"inf\"", f);
    else
        fprintf(f, "%.*g", digits, v);
}

/* One element of a scalar type at p (unaligned: copied out). */
static void json_scalar(FILE *f, uint32_t type, const unsigned char *p)
{
    union {
        uint8_t u8;
        uint16_t u16;
        uint32_t u32;
        uint64_t u64;
        int8_t i8;
        int16_t i16;
        int32_t i32;
        int64_t i64;
        float f32;
        double f64;
    } v;
    memcpy(&v, p, kwt_type_size(type));
    switch (type) {
    case KEEL_U8:     fprintf(f, "%" PRIu8, v.u8); break;
    case KEEL_U16:    fprintf(f, "%" PRIu16, v.u16); break;
    case KEEL_U32:    fprintf(f, "%" PRIu32, v.u32); break;
    case KEEL_U64:    fprintf(f, "%" PRIu64, v.u64); break;
    case KEEL_I8:     fprintf(f, "%" PRId8, v.i8); break;
    case KEEL_I16:    fprintf(f, "%" PRId16, v.i16); break;
    case KEEL_I32:    fprintf(f, "%" PRId32, v.i32); break;
    case KEEL_I64:    fprintf(f, "%" PRId64, v.i64); break;
    case KEEL_F32:    json_float(f, v.f32, 9); break;
    case KEEL_F64:    json_float(f, v.f64, 17); break;
    case KEEL_BOOL:   v.u8 <= 1 ? fputs(v.u8 ? "true" : "false", f) : fprintf(f, "%u", v.u8); break;
    case KEEL_ENTITY: kwt_json_entity(f, v.u64); break;
    default:          kwt_json_hex(f, p, 1); break;
    }
}

void kwt_json_field(FILE *f, const kw_field *fl, const void *value, size_t size)
{
    const unsigned char *p = (const unsigned char *)value + fl->offset;
    uint32_t w = kwt_type_size(fl->type), count = fl->count ? fl->count : 1;
    uint64_t bytes = (uint64_t)w * count;
    if (!w || fl->offset > size || bytes > size - fl->offset) {
        fputs("null", f); /* the schema decoder checks this; stay safe on a damaged one */
        return;
    }
    if (fl->type == KEEL_BYTES) {
        kwt_json_hex(f, p, count);
        return;
    }
    if (count == 1) {
        json_scalar(f, fl->type, p);
        return;
    }
    fputc('[', f);
    for (uint32_t i = 0; i < count; i++) {
        if (i)
            fputc(',', f);
        json_scalar(f, fl->type, p + (size_t)i * w);
    }
    fputc(']', f);
}

void kwt_json_value(FILE *f, const kwt_dir *d, uint32_t comp, const void *value, size_t size)
{
    const kw_component *c = d->has_schema ? kw_schema_get(&d->schema, comp) : NULL;
    if (!c || c->size != size || (size && !value)) {
        kwt_json_hex(f, value, value ? size : 0);
        return;
    }
    fputc('{', f);
    for (uint32_t i = 0; i < c->nfields; i++) {
        if (i)
            fputc(',', f);
        kwt_json_string(f, c->fields[i].name);
        fputc(':', f);
        kwt_json_field(f, &c->fields[i], value, size);
    }
    fputc('}', f);
}

void kwt_json_schema(FILE *f, const kw_schema *s)
{
    fputc('[', f);
    for (uint32_t i = 0; i < s->ncomps; i++) {
        const kw_component *c = &s->comps[i];
        fprintf(f, "%s{\"id\":%u,\"name\":", i ? "," : "", c->id);
        kwt_json_string(f, c->name);
        fprintf(f, ",\"size\":%u,\"align\":%u,\"discipline\":\"%s\",\"fields\":[", c->size, c->align,
                kwt_discipline_name(c->discipline));
        for (uint32_t j = 0; j < c->nfields; j++) {
            const kw_field *fl = &c->fields[j];
            fprintf(f, "%s{\"name\":", j ? "," : "");
            kwt_json_string(f, fl->name);
            fprintf(f, ",\"type\":\"%s\",\"offset\":%u,\"count\":%u}", kwt_type_name(fl->type), fl->offset,
                    fl->count);
        }
        fputs("]}", f);
    }
    fputc(']', f);
}

static void json_comp_key(FILE *f, const kwt_dir *d, uint32_t comp)
{
    char buf[16];
    kwt_json_string(f, kwt_comp_name(d, comp, buf));
}

void kwt_json_change(FILE *f, const kwt_dir *d, const kw_change *c)
{
    static const char *const ops[] = {"set", "spawn", "destroy", "add", "remove"};
    fprintf(f, "{\"op\":\"%s\",\"entity\":", c->op < 5 ? ops[c->op] : "?");
    kwt_json_entity(f, c->entity);
    switch (c->op) {
    case KW_OP_SET:
    case KW_OP_ADD:
        fputs(",\"component\":", f);
        json_comp_key(f, d, c->component);
        fputs(",\"value\":", f);
        kwt_json_value(f, d, c->component, c->value, c->size);
        break;
    case KW_OP_REMOVE:
        fputs(",\"component\":", f);
        json_comp_key(f, d, c->component);
        break;
    case KW_OP_SPAWN:
        fputs(",\"components\":{", f);
        for (uint32_t i = 0; i < c->n; i++) {
            if (i)
                fputc(',', f);
            json_comp_key(f, d, c->comps[i]);
            fputc(':', f);
            kwt_json_value(f, d, c->comps[i], c->values[i], c->sizes[i]);
        }
        fputc('}', f);
        break;
    default:
        break;
    }
    fputc('}', f);
}

/* ---- progress ----------------------------------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void kwt_progress_begin(kwt_progress *p, const char *what, uint64_t total)
{
    *p = (kwt_progress){.on = isatty(STDERR_FILENO) == 1, .what = what, .total = total};
    p->last_ns = now_ns();
}

void kwt_progress_step(kwt_progress *p, uint64_t done)
{
    if (!p->on || done < p->next_check)
        return;
    p->next_check = done + 256; /* read the clock every 256 steps only */
    uint64_t t = now_ns();
    if (t - p->last_ns < 100000000u)
        return;
    p->last_ns = t;
    if (p->total)
        fprintf(stderr, "\r%s %" PRIu64 "/%" PRIu64 " (%u%%)\033[K", p->what, done, p->total,
                (unsigned)(done * 100 / p->total));
    else
        fprintf(stderr, "\r%s %" PRIu64 "\033[K", p->what, done);
    fflush(stderr);
}

void kwt_progress_end(kwt_progress *p)
{
    if (p->on && p->next_check) /* something was drawn or may have been */
        fputs("\r\033[K", stderr);
}
