/*
 * tools/keel-wal/main.c -- keel-wal, the inspector of keel data
 * directories: the subcommand table and dispatch. Each subcommand lives in
 * its own file (info.c, dump.c ...); kwt.h has the shared conventions and
 * docs/tools.md the user's manual.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "kwt.h"

const kwt_command kwt_commands[] = {
    {"info", kwt_cmd_info, "format, schema, checkpoint, LSN and tick range, record counts, sizes"},
    {"dump", kwt_cmd_dump, "print records, one per line (filters; --json for JSON lines)"},
    {"verify", kwt_cmd_verify, "check every record; exit 0 valid, 1 problems found, 2 cannot open"},
    {"stats", kwt_cmd_stats, "bytes and counts per component, kind and tick range; top ticks"},
    {"tail", kwt_cmd_tail, "print the last records, and with -f new ones as they commit"},
    {"replay", kwt_cmd_replay, "rebuild the state at a tick: its hash, or an entity as JSON"},
    {"diff", kwt_cmd_diff, "entities created, destroyed and changed between two ticks"},
    {"backup", kwt_cmd_backup, "a consistent copy of a (live) directory: keel-wal backup DIR DEST"},
    {"restore", kwt_cmd_restore, "a data directory from a stream: keel-wal restore nats://H:P/WORLD DEST"},
    {"detach", kwt_cmd_detach, "make a replicated world's directory a local world's (not beside a server)"},
    {NULL, NULL, NULL},
};

static int usage(FILE *f)
{
    fprintf(f, "usage: keel-wal <command> DIR [options]\n"
               "\n"
               "Inspect a keel data directory (read-only; works beside a running server),\n"
               "back it up, or detach it from its stream.\n"
               "\n"
               "commands:\n");
    for (const kwt_command *c = kwt_commands; c->name; c++)
        fprintf(f, "  %-7s %s\n", c->name, c->summary);
    fprintf(f, "\n"
               "'keel-wal <command> --help' describes a command. Entity handles are 16 hex digits\n"
               "(as printed), 0x<hex> or INDEX:GEN. Exit status: 0 ok; 1 a problem found (verify's\n"
               "findings, or invalid records another command met and skipped);\n"
               "2 bad arguments, the directory cannot be opened, or out of memory. Manual: docs/tools.md.\n");
    return f == stdout ? KWT_EXIT_OK : KWT_EXIT_USAGE;
}

/* A command whose work ran out of memory somewhere -- however that call
 * site reacted: a skipped record, a missing part, a "problem" -- exits 2
 * saying so, so that what it printed is never taken for the whole answer.
 * (An exit 2 has already said why.) */
static int finish(int rc)
{
    if (rc == KWT_EXIT_USAGE || !kwt_out_of_memory())
        return rc;
    fprintf(stderr, "keel-wal: out of memory: the output is incomplete\n");
    return KWT_EXIT_USAGE;
}

int main(int argc, char **argv)
{
    /* a closed pipe (keel-wal dump | head) ends the output quietly: write fails with EPIPE */
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2)
        return usage(stderr);
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h"))
        return usage(stdout);
    if (!strcmp(name, "help")) { /* keel-wal help [command] */
        if (argc < 3)
            return usage(stdout);
        name = argv[2];
        for (const kwt_command *c = kwt_commands; c->name; c++)
            if (!strcmp(c->name, name))
                return c->run(2, (char *[]){argv[2], "--help", NULL});
    }
    for (const kwt_command *c = kwt_commands; c->name; c++)
        if (!strcmp(c->name, name))
            return finish(c->run(argc - 1, argv + 1));
    fprintf(stderr, "keel-wal: unknown command '%s' (try 'keel-wal --help')\n", name);
    return KWT_EXIT_USAGE;
}
