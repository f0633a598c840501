/*
 * tools/keel-wal/tail.c -- `keel-wal tail DIR [-n N] [-f] [--json]`: the
 * last records, and with -f every record committed afterwards.
 *
 * Following is polling: each poll begins a fresh read transaction (a new
 * snapshot, so it sees what the server committed since), prints the
 * records after the last one printed, and ends the transaction before
 * sleeping -- a reader held across the sleep would keep the server's old
 * pages alive. The sleep is a nanosleep that SIGINT/SIGTERM interrupt;
 * a reader that closes the pipe ends the loop as well (SIGPIPE is ignored
 * in main, writes fail with EPIPE, and between polls stdout is checked).
 */
#include <inttypes.h>
#include <signal.h>
#include <string.h>
#include <time.h>

#include "kwt.h"

static const char tail_help[] =
    "usage: keel-wal tail DIR [-n N] [-f] [--interval MS] [--json]\n"
    "\n"
    "Print the last N WAL records (default 10) in dump's format. With -f, keep\n"
    "following: print every record committed afterwards, polling with a fresh read\n"
    "transaction every MS milliseconds (default 200), until Ctrl-C (SIGINT),\n"
    "SIGTERM, or the reader of a pipe goes away. Works beside a running server.\n"
    "\n"
    "  -n N, --lines N   records to print first (0 = only new ones)\n"
    "  -f, --follow      follow new records\n"
    "  --interval MS     poll period with -f (1..60000, default 200)\n"
    "  --json            JSON lines as 'keel-wal dump --json'\n"
    "\n"
    "Exit status: 0 (also when interrupted); 1 when a record is invalid (reported,\n"
    "skipped); 2 bad arguments or the directory cannot be opened.\n";

typedef struct tail_opts {
    const char *dir;
    uint64_t lines, interval_ms;
    bool follow, json;
} tail_opts;

static volatile sig_atomic_t tail_stop;

static void on_stop(int sig)
{
    (void)sig;
    tail_stop = 1;
}

static int parse_args(int argc, char **argv, void *opts)
{
    tail_opts *o = opts;
    for (int i = 1; i < argc; i++) {
        int rc;
        if ((rc = kwt_opt_u64("tail", argc, argv, &i, "-n", &o->lines)) ||
            (rc = kwt_opt_u64("tail", argc, argv, &i, "--lines", &o->lines)) ||
            (rc = kwt_opt_u64("tail", argc, argv, &i, "--interval", &o->interval_ms))) {
            if (rc < 0)
                return KWT_EXIT_USAGE;
        } else if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--follow")) {
            o->follow = true;
        } else if (!strcmp(argv[i], "--json")) {
            o->json = true;
        } else if (kwt_arg_dir("tail", argv[i], &o->dir)) {
            return KWT_EXIT_USAGE;
        }
    }
    if (kwt_need_dir("tail", o->dir))
        return KWT_EXIT_USAGE;
    if (o->interval_ms < 1 || o->interval_ms > 60000)
        return kwt_usage_error("tail", "--interval wants 1..60000 milliseconds");
    return KWT_EXIT_OK;
}

/* Print the records with LSN >= from in a fresh snapshot; *next = one past
 * the last printed. `following`: from is where the tail left off, so a
 * first record past it means records went unread (said on stderr). */
static int print_from(kwt_dir *d, const tail_opts *o, uint64_t from, uint64_t *next, bool *problem, bool following)
{
    kw_rtxn *r;
    int rc = kwt_read_begin(d, &r);
    if (rc)
        return rc;
    kw_scan *s;
    kw_range range = {.from_lsn = from};
    if (kw_scan_begin(r, &range, &s)) {
        kwt_err(d->path, "%s", keel_last_error());
        kw_read_end(r);
        return KWT_EXIT_USAGE;
    }
    kw_record rec;
    while (!tail_stop && !kwt_output_broken() && (rc = kwt_scan_next(s, &rec)) > 0) {
        if (following && rec.lsn > from) /* in the scan's own snapshot: nothing can go unsaid */
            kwt_err(d->path, "LSN %" PRIu64 "..%" PRIu64 " went before this tail read them (%s); following from "
                    "LSN %" PRIu64, from, rec.lsn - 1,
                    d->stream ? "the stream's copy started again at its published checkpoint"
                              : "deleted by a checkpoint", rec.lsn);
        following = false;
        if (rc == KWT_SCAN_INVALID) {
            kwt_err(d->path, "LSN %" PRIu64 ": %s (skipped)", rec.lsn, keel_last_error());
            *problem = true;
        } else if (kwt_print_record(d, &rec, o->json)) {
            *problem = true;
        }
        *next = rec.lsn + 1;
    }
    kw_scan_end(s);
    kw_read_end(r);
    fflush(stdout);
    if (rc < 0) {
        kwt_err(d->path, "%s", keel_last_error());
        *problem = true;
    }
    return KWT_EXIT_OK;
}

/* The WAL's last LSN now (0 when empty). */
static int last_lsn(kwt_dir *d, uint64_t *last)
{
    kw_rtxn *r;
    uint64_t first;
    int rc = kwt_dir_refresh(d);
    if (!rc)
        rc = kwt_read_begin(d, &r);
    if (rc)
        return rc;
    *last = 0;
    kw_wal_bounds(r, &first, last, NULL);
    kw_read_end(r);
    return KWT_EXIT_OK;
}

static void sleep_ms(uint64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL); /* a signal cuts it short: the loop then sees tail_stop */
}

static int follow(kwt_dir *d, const tail_opts *o, uint64_t next, bool *problem)
{
    struct sigaction sa = {.sa_handler = on_stop}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    int rc = KWT_EXIT_OK;
    while (!rc && !tail_stop && !kwt_output_broken() && !kwt_output_reader_gone()) {
        sleep_ms(o->interval_ms);
        uint64_t last;
        if (tail_stop || (rc = last_lsn(d, &last)))
            break;
        if (last && last + 1 < next) { /* LSNs handed out again after a truncated tail */
            kwt_err(d->path, "the WAL now ends at LSN %" PRIu64 " (a bad tail was truncated); following from there",
                    last);
            next = last + 1;
        }
        if (last >= next) /* it says so when records before `next` went (a checkpoint, a stream's purge) */
            rc = print_from(d, o, next, &next, problem, true);
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    return rc;
}

static int run(kwt_dir *d, void *opts)
{
    const tail_opts *o = opts;
    uint64_t last = 0, next;
    bool problem = false;
    int rc = last_lsn(d, &last);
    if (!rc) {
        /* an empty WAL after a checkpoint goes on after what the checkpoint covers */
        uint64_t end = !last && d->has_checkpoint ? d->checkpoint.lsn : last;
        next = end + 1;
        if (o->lines && last)
            rc = print_from(d, o, last >= o->lines ? last - o->lines + 1 : 1, &next, &problem, false);
        if (!rc && o->follow)
            rc = follow(d, o, end + 1 > next ? end + 1 : next, &problem);
    }
    return !rc && problem ? KWT_EXIT_PROBLEM : rc;
}

int kwt_cmd_tail(int argc, char **argv)
{
    tail_opts o = {.lines = 10, .interval_ms = 200};
    return kwt_run_on_dir(argc, argv, tail_help, parse_args, &o, &o.dir, run);
}
