/*
 * tools/keel-wal/backup.c -- keel-wal backup DIR DEST: a consistent copy of
 * a data directory, also of one a server is writing (kw_store_backup:
 * LMDB's compacting copy in one read transaction). Restoring is copying
 * the backup back and starting the server on it: recovery from the copy is
 * recovery after a crash at the instant of the copy (docs/operations.md).
 */
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>

#include "kwt.h"

static const char backup_help[] =
    "usage: keel-wal backup DIR DEST\n"
    "\n"
    "Copy data directory DIR to the new directory DEST, consistently, also while a\n"
    "server runs on DIR: LMDB's compacting copy inside one read transaction, so the\n"
    "copy holds exactly one committed state and recovers, like a directory after a\n"
    "crash, to a completed tick (plus the side transactions committed by then). Free\n"
    "pages are left out, so the copy can be smaller than DIR. The directory's other\n"
    "files (an application's own, such as keel-world's world.params) are copied too.\n"
    "DEST must not exist (its parent must) or be an empty directory. The data file\n"
    "is written as DEST/data.mdb.new, synced, and renamed to data.mdb: a failed backup\n"
    "leaves no data.mdb. To restore, stop the server, put the backup in place of the\n"
    "directory (or start the server on DEST) and start it.\n"
    "\n"
    "Prints 'backup: DIR -> DEST: <bytes> bytes (tick <T> checkpoint, LSN <a>..<b>)'.\n"
    "Exit status: 0; 1 DIR's data file is damaged; 2 bad arguments, DEST exists and is\n"
    "not empty, DIR cannot be opened, or the copy failed.\n";

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
    /* the checks of every command first: a damaged DIR exits 1 with their sentence */
    kwt_dir d;
    int rc = kwt_dir_open(dir, &d);
    if (rc)
        return rc;
    kwt_dir_close(&d);
    if (kw_store_backup(dir, dest)) {
        kwt_err(dir, "%s", keel_last_error());
        return KWT_EXIT_USAGE;
    }
    /* describe the copy by opening it as every command does: a backup that does not open is no backup */
    if ((rc = kwt_dir_open(dest, &d)))
        return rc;
    kw_rtxn *r;
    uint64_t first = 0, last = 0;
    if ((rc = kwt_read_begin(&d, &r))) {
        kwt_dir_close(&d);
        return rc;
    }
    (void)kw_wal_bounds(r, &first, &last, NULL);
    kw_read_end(r);
    char ck[64] = "no checkpoint";
    if (d.has_checkpoint)
        snprintf(ck, sizeof ck, "checkpoint tick %" PRIu64, d.checkpoint.tick);
    printf("backup: %s -> %s: %" PRIu64 " bytes (%s, WAL LSN %" PRIu64 "..%" PRIu64 ")\n", dir, dest,
           kw_store_file_size(d.store), ck, first, last);
    kwt_dir_close(&d);
    return kwt_output_finish(KWT_EXIT_OK);
}
