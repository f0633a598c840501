/*
 * tools/keel-wal/backup.c -- keel-wal backup DIR DEST: a consistent copy of
 * a data directory, also of one a server is writing (kw_store_backup:
 * LMDB's compacting copy in one read transaction). Restoring is copying
 * the backup back and starting the server on it: recovery from the copy is
 * recovery after a crash at the instant of the copy (docs/operations.md).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "keel_repl/repl.h"
#include "kwt.h"

static const char backup_help[] =
    "usage: keel-wal backup DIR DEST\n"
    "\n"
    "Copy data directory DIR to the new directory DEST, consistently, also while a\n"
    "server runs on DIR: LMDB's compacting copy inside one read transaction, so the\n"
    "copy holds exactly one committed state and recovers, like a directory after a\n"
    "crash, to a completed tick (plus the side transactions committed by then). Free\n"
    "pages are left out, so the copy can be smaller than DIR. The directory's other\n"
    "files (an application's own, such as keel-world's world.params) are copied too,\n"
    "each file with its source's permission bits. DIR is a directory: a stream is\n"
    "copied into one with keel-wal restore. DEST must not exist (its parent must) or\n"
    "be an empty directory. The data file is written as DEST/data.mdb.new, synced, and\n"
    "renamed to data.mdb; creating data.mdb.new (exclusively) claims DEST, so a second\n"
    "backup into the same DEST is refused. A failed backup, or one ended by SIGINT,\n"
    "SIGTERM or SIGHUP, leaves DEST as it was: what it made there is removed, DEST too\n"
    "when it made it. To restore, stop the server, put the backup in place of the\n"
    "directory (or start the server on DEST) and start it.\n"
    "\n"
    "Prints 'backup: DIR -> DEST: <bytes> bytes (checkpoint tick <T>, WAL LSN <a>..<b>)'\n"
    "('no checkpoint' in place of 'checkpoint tick <T>' without one), read from the\n"
    "copy without leaving a file in it. Should that reading fail, the backup is still\n"
    "complete: stderr says why and the exit status is 0.\n"
    "Exit status: 0; 1 DIR's data file is damaged (also where the copy finds it so);\n"
    "2 bad arguments, DEST exists and is not empty, another backup is writing into\n"
    "DEST, DIR cannot be opened, or the copy failed.\n";

/* The WAL's first and last LSN (0 when empty) and its record count (count may be NULL). */
static int wal_bounds(kwt_dir *d, uint64_t *first, uint64_t *last, uint64_t *count)
{
    kw_rtxn *r;
    int rc = kwt_read_begin(d, &r);
    if (rc)
        return rc;
    *first = *last = 0;
    rc = kw_wal_bounds(r, first, last, count);
    kw_read_end(r);
    if (!rc || rc == KEEL_ENOENT)
        return KWT_EXIT_OK;
    kwt_err(d->path, "%s", keel_last_error());
    return rc == KEEL_ECORRUPT ? KWT_EXIT_PROBLEM : KWT_EXIT_USAGE;
}

/* The summary line, read from the finished copy (opened without a lock
 * file, so that DEST holds what the backup wrote and nothing else). */
static int describe_backup(const char *dir, const char *dest)
{
    kwt_dir d;
    uint64_t first = 0, last = 0;
    int rc = kwt_dir_open_still(dest, &d);
    if (rc)
        return rc;
    if ((rc = wal_bounds(&d, &first, &last, NULL))) {
        kwt_dir_close(&d);
        return rc;
    }
    char ck[64] = "no checkpoint";
    if (d.has_checkpoint)
        snprintf(ck, sizeof ck, "checkpoint tick %" PRIu64, d.checkpoint.tick);
    printf("backup: %s -> %s: %" PRIu64 " bytes (%s, WAL LSN %" PRIu64 "..%" PRIu64 ")\n", dir, dest,
           kw_store_file_size(d.store), ck, first, last);
    kwt_dir_close(&d);
    return KWT_EXIT_OK;
}

int kwt_cmd_backup(int argc, char **argv)
{
    if (kwt_help_requested(argc, argv))
        return kwt_print_help(backup_help);
    const char *dir = NULL, *dest = NULL;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-')
            return kwt_usage_error("backup", "unknown option '%s'", argv[i]);
        if (dest)
            return kwt_usage_error("backup", "give two directories, DIR and DEST ('%s' is a third)", argv[i]);
        *(dir ? &dest : &dir) = argv[i];
    }
    if (!dest)
        return kwt_usage_error("backup", dir ? "give the destination DEST" : "give the data directory and DEST");
    if (kwt_is_stream(dir))
        return kwt_usage_error("backup", "'%s' is a stream address, not a data directory (a stream is copied into "
                                         "a new directory with keel-wal restore)", dir);
    /* the checks of every command first: a damaged DIR exits 1 with their sentence */
    kwt_dir d;
    int rc = kwt_dir_open(dir, &d);
    if (rc)
        return rc;
    kwt_dir_close(&d);
    if ((rc = kwt_backup(dir, dest))) {
        kwt_err(dir, "%s", keel_last_error());
        return rc == KEEL_ECORRUPT ? KWT_EXIT_PROBLEM : KWT_EXIT_USAGE;
    }
    /* the backup is complete and durable: a summary that cannot be read does not undo it */
    if (describe_backup(dir, dest))
        kwt_err(dest, "the backup is complete and in place; its summary could not be read (the reason above)");
    return kwt_output_finish(KWT_EXIT_OK);
}

/* ---- restore ------------------------------------------------------------------------ */

static const char restore_help[] =
    "usage: keel-wal restore nats://HOST:PORT/WORLD DEST [--to-tick T]\n"
    "\n"
    "Build the new data directory DEST from a replicated world's stream\n"
    "(docs/replication.md): every record, byte for byte at its LSN, or with --to-tick\n"
    "T those up to tick T's commit marker, so that DEST recovers to the state after\n"
    "tick T. DEST must not exist (its parent must) or be an empty directory; it holds\n"
    "no world.params (keel-world records the flags of its first run). The copy is\n"
    "made in a private directory first: a failed restore leaves no data.mdb in DEST.\n"
    "\n"
    "Prints 'restore: ADDRESS -> DEST: <records> records (LSN <a>..<b>, tick <T>)'.\n"
    "Exit status: 0; 1 what the stream holds fails verify's checks (the problems on\n"
    "stderr; nothing restored); 2 bad arguments, the stream cannot be read, it holds\n"
    "no tick T, or DEST cannot take the copy.\n";

typedef struct cut {
    uint64_t from, deleted;
    kw_buf schema;             /* the last schema record kept (empty: none) */
} cut;

/* The WAL from c->from on goes; the stored schema becomes the last schema
 * record kept: schemas only grow, so the one stored may be a later tick's. */
static int fill_cut(kw_wtxn *t, void *arg)
{
    cut *c = arg;
    int rc = kw_del_wal_from(t, c->from, &c->deleted);
    if (!rc && c->schema.len)
        rc = kw_put(t, KW_DB_SCHEMA, KW_SCHEMA_KEY, strlen(KW_SCHEMA_KEY), c->schema.p, c->schema.len);
    return rc;
}

/* The last schema record before LSN `before`, copied into c->schema. */
static int schema_before(kwt_dir *d, cut *c)
{
    kw_rtxn *r;
    kw_scan *s = NULL;
    kw_record rec;
    int rc = kwt_read_begin(d, &r);
    if (rc)
        return rc;
    kw_range range = {.from_lsn = 1, .to_lsn = c->from - 1, .kinds = 1u << KW_KIND_SCHEMA};
    if (!(rc = kw_scan_begin(r, &range, &s)))
        while ((rc = kw_scan_next(s, &rec)) == 1 || rc == KEEL_ECORRUPT)
            if (rc == 1 && (c->schema.len = 0, (rc = kw_put_bytes(&c->schema, rec.rec, rec.len))))
                break;
    kw_scan_end(s);
    kw_read_end(r);
    if (rc < 0) {
        kwt_err(d->path, "%s", keel_last_error());
        return KWT_EXIT_USAGE;
    }
    return KWT_EXIT_OK;
}

/* The LSN of tick T's commit marker (not on_first_tick's; 0 when absent)
 * and the last tick committed (0: none). */
static int commit_of_tick(kwt_dir *d, uint64_t tick, uint64_t *lsn, uint64_t *last_tick)
{
    kw_rtxn *r;
    int rc = kwt_read_begin(d, &r);
    if (rc)
        return rc;
    kw_range range = {.kinds = 1u << KW_KIND_TICK_COMMIT};
    kw_scan *s;
    kw_record rec;
    *lsn = *last_tick = 0;
    if (kw_scan_begin(r, &range, &s)) {
        kw_read_end(r);
        kwt_err(d->path, "%s", keel_last_error());
        return KWT_EXIT_USAGE;
    }
    while ((rc = kw_scan_next(s, &rec)) == 1 || rc == KEEL_ECORRUPT) { /* an invalid record: skipped */
        if (rc != 1 || (rec.h.flags & KW_FLAG_HOOK))
            continue;
        *lsn = rec.h.tick == tick ? rec.lsn : *lsn;
        *last_tick = rec.h.tick > *last_tick ? rec.h.tick : *last_tick;
    }
    kw_scan_end(s);
    kw_read_end(r);
    return KWT_EXIT_OK;
}

/* The schema the stream's published checkpoint was published with, into
 * c->schema: the copy stores the stream's latest, which may have grown
 * since. Read from the checkpoint's first two messages; nothing written. */
static int checkpoint_schema(kwt_dir *d, cut *c)
{
    kw_checkpoint_meta meta;
    c->schema.len = 0;
    int rc = kr_ckpt_head(d->stream, &meta, &c->schema);
    if (!rc && meta.lsn != d->checkpoint.lsn) {
        kwt_err(d->path, "a newer checkpoint was published while the stream was read: try again");
        return KWT_EXIT_USAGE;
    }
    if (rc) {
        kwt_err(d->path, "%s", keel_last_error());
        return KWT_EXIT_USAGE;
    }
    return KWT_EXIT_OK;
}

/* Where DEST's WAL ends (c->from: the first LSN cut away, 0 for none) and
 * the schema it stores then. --to-tick T cuts after tick T's commit
 * marker. A copy of a purged stream starts at the stream's published
 * checkpoint (the records retained before it in its WAL alone): tick T is
 * then its tick or a later one, and the schema of T is the last schema
 * record before the cut or else the checkpoint's; at the checkpoint's
 * tick DEST holds the checkpoint and no record after the LSN it covers.
 * A stream without a world, or without tick T, is refused: nothing is
 * written. */
static int restore_cut(kwt_dir *d, bool to_given, uint64_t to_tick, cut *c)
{
    uint64_t first = 0, last = 0, count = 0, last_tick = 0;
    int rc = wal_bounds(d, &first, &last, &count);
    if (rc)
        return rc;
    if (!count && !d->has_checkpoint) {
        kwt_err(d->path, "the stream holds no record and no published checkpoint: no world to restore");
        return KWT_EXIT_USAGE;
    }
    if (!to_given)
        return KEEL_OK;
    if (d->has_checkpoint && to_tick < d->checkpoint.tick) { /* its records may be retained, its state is not */
        kwt_err(d->path, "tick %" PRIu64 " is before the stream's published checkpoint of tick %" PRIu64 ", the oldest "
                "state the purged stream keeps (no older state can be rebuilt): it restores tick %" PRIu64
                " or a later one", to_tick, d->checkpoint.tick, d->checkpoint.tick);
        return KWT_EXIT_USAGE;
    }
    if ((rc = commit_of_tick(d, to_tick, &c->from, &last_tick)))
        return rc;
    /* the checkpoint and no record after it: what it covers after tick T's commit (a promotion's EPOCH,
       an open's schema) is in its state */
    if (d->has_checkpoint && d->checkpoint.tick == to_tick && c->from < d->checkpoint.lsn)
        c->from = d->checkpoint.lsn;
    if (c->from) {
        c->from++;
        rc = schema_before(d, c);
        return !rc && !c->schema.len && d->has_checkpoint ? checkpoint_schema(d, c) : rc;
    }
    kwt_err(d->path, "the stream holds no commit of tick %" PRIu64 " (it ends at tick %" PRIu64 ")", to_tick,
            last_tick > d->checkpoint.tick ? last_tick : d->checkpoint.tick);
    return KWT_EXIT_USAGE;
}

int kwt_cmd_restore(int argc, char **argv)
{
    if (kwt_help_requested(argc, argv))
        return kwt_print_help(restore_help);
    const char *src = NULL, *dest = NULL;
    uint64_t to_tick = 0;
    bool to_given = false;
    for (int i = 1; i < argc; i++) {
        int rc = kwt_opt_u64("restore", argc, argv, &i, "--to-tick", &to_tick);
        if (rc < 0)
            return KWT_EXIT_USAGE;
        if (rc) {
            to_given = true;
            continue;
        }
        if (argv[i][0] == '-')
            return kwt_usage_error("restore", "unknown option '%s'", argv[i]);
        if (dest)
            return kwt_usage_error("restore", "give a stream and DEST ('%s' is a third)", argv[i]);
        *(src ? &dest : &src) = argv[i];
    }
    if (!dest)
        return kwt_usage_error("restore", src ? "give the destination DEST" : "give the stream and DEST");
    if (!kwt_is_stream(src))
        return kwt_usage_error("restore", "'%s' is no stream address nats://HOST:PORT/WORLD (a directory is copied "
                                          "with keel-wal backup)", src);
    kwt_dir d;
    int rc = kwt_dir_open(src, &d);
    if (rc)
        return rc;
    cut c = {0};
    rc = restore_cut(&d, to_given, to_tick, &c);
    if (!rc && c.from && kw_store_write(d.store, fill_cut, &c)) {
        kwt_err(src, "%s", keel_last_error());
        rc = KWT_EXIT_USAGE;
    }
    kw_buf_free(&c.schema);
    /* the copy is what DEST would hold: it must pass verify's checks (a published checkpoint whose
       schema or snapshot records are damaged does, as a bootstrap's load would refuse it) */
    if (!rc && (rc = kwt_check_dir(&d)) == KWT_EXIT_PROBLEM)
        kwt_err(src, "the stream's checkpoint and records do not make a sound data directory (the problems "
                     "above): nothing restored");
    char copy[sizeof d.copy];
    snprintf(copy, sizeof copy, "%s", d.copy);
    d.copy[0] = 0; /* kept past the close: the backup below reads it */
    kwt_dir_close(&d);
    if (!rc && kwt_backup(copy, dest)) {
        kwt_err(dest, "%s", keel_last_error());
        rc = KWT_EXIT_USAGE;
    }
    kwt_remove_copy(copy);
    if (rc)
        return rc;
    if ((rc = kwt_dir_open_still(dest, &d)))
        return rc;
    uint64_t first = 0, last = 0, count = 0;
    if ((rc = wal_bounds(&d, &first, &last, &count))) {
        kwt_dir_close(&d);
        return rc;
    }
    char upto[48] = "";
    if (to_given)
        snprintf(upto, sizeof upto, ", tick %" PRIu64, to_tick);
    printf("restore: %s -> %s: %" PRIu64 " records (LSN %" PRIu64 "..%" PRIu64 "%s)\n", src, dest, count, first, last,
           upto);
    kwt_dir_close(&d);
    return kwt_output_finish(KWT_EXIT_OK);
}
