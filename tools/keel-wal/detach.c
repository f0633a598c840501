/*
 * tools/keel-wal/detach.c -- keel-wal detach DIR: a replicated world's
 * directory made a local world's. The mark (meta "replicated", the stream's
 * name) is what makes a directory's checkpoints keep every WAL record its
 * stream has not acknowledged (docs/replication.md, "The WAL on disk"): run
 * without replication, such a directory -- a former primary, a replica, a
 * `restore` -- would never delete its WAL. Removing the mark is the whole
 * change; the world's state and WAL are untouched.
 */
#include <stdio.h>
#include <string.h>

#include "kwt.h"

static const char detach_help[] =
    "usage: keel-wal detach DIR\n"
    "\n"
    "Make DIR, the directory of a replicated world (a primary's, a replica's, or one\n"
    "'keel-wal restore' built), a local world's: remove its mark as the stream's\n"
    "directory (meta \"replicated\", the stream's identity \"stream_id\"). A stream's\n"
    "directory keeps, at each checkpoint, every WAL record the stream has not\n"
    "acknowledged, so run without replication it keeps its whole WAL; detached, its\n"
    "checkpoints delete the WAL they cover, as a local directory's do. The world's\n"
    "state and WAL are not changed. No server may hold DIR (it is refused, nothing\n"
    "written). Run replicated again later, DIR is the stream's again only where it\n"
    "shares a record with the stream: what it holds beyond the stream is dropped, as\n"
    "on any node's open, and a directory that shares no record with the stream is\n"
    "refused (docs/replication.md).\n"
    "\n"
    "Prints 'detach: DIR: no longer the directory of stream <name>', or\n"
    "'detach: DIR: the directory of no stream (nothing to do)'.\n"
    "Exit status: 0; 1 DIR's data file is damaged; 2 bad arguments, DIR cannot be\n"
    "opened, a server holds it, or the write failed.\n";

static int fill_detach(kw_wtxn *t, void *arg)
{
    (void)arg;
    int rc = kw_del(t, KW_DB_META, KW_META_REPLICATED, strlen(KW_META_REPLICATED));
    if (!rc)
        rc = kw_del(t, KW_DB_META, KW_META_STREAM_ID, strlen(KW_META_STREAM_ID));
    return rc ? rc : kw_del(t, KW_DB_META, KW_META_SEEDING, strlen(KW_META_SEEDING)); /* a seed cut short */
}

int kwt_cmd_detach(int argc, char **argv)
{
    if (kwt_help_requested(argc, argv))
        return kwt_print_help(detach_help);
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-')
            return kwt_usage_error("detach", "unknown option '%s'", argv[i]);
        if (dir)
            return kwt_usage_error("detach", "give one directory ('%s' is a second)", argv[i]);
        dir = argv[i];
    }
    if (!dir)
        return kwt_usage_error("detach", "give the data directory");
    if (kwt_is_stream(dir))
        return kwt_usage_error("detach", "'%s' is a stream: give a data directory", dir);
    /* the checks of every command first: a damaged DIR exits 1 with their sentence */
    kwt_dir d;
    int rc = kwt_dir_open(dir, &d);
    if (rc)
        return rc;
    char stream[sizeof d.stream_name];
    bool marked = d.replicated;
    memcpy(stream, d.stream_name, sizeof stream);
    kwt_dir_close(&d);
    if (!marked) {
        printf("detach: %s: the directory of no stream (nothing to do)\n", dir);
        return kwt_output_finish(KWT_EXIT_OK);
    }
    /* owned, as a server owns it: refused while one runs on it, and none starts meanwhile */
    kw_store *s = NULL;
    if (kw_store_open(dir, &(kw_store_desc){.flags = KW_OPEN_OWN}, &s) || kw_store_write(s, fill_detach, NULL)) {
        kwt_err(dir, "%s", keel_last_error());
        kw_store_close(s);
        return KWT_EXIT_USAGE;
    }
    kw_store_close(s);
    printf("detach: %s: no longer the directory of stream %s\n", dir, stream);
    return kwt_output_finish(KWT_EXIT_OK);
}
