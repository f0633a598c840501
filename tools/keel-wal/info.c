/*
 * tools/keel-wal/info.c -- `keel-wal info DIR [--json]`: what a data
 * directory holds. Reads headers only (no decompression), in one read
 * transaction, so it is cheap and consistent beside a live server.
 */
#include <inttypes.h>
#include <string.h>
#include <time.h>

#include "kwt.h"

static const char info_help[] =
    "usage: keel-wal info DIR [--json]\n"
    "\n"
    "Describe a data directory: format version, data file size, checkpoint (tick,\n"
    "covered LSN), WAL LSN and tick range, last committed tick, record counts and\n"
    "payload bytes per kind (raw = uncompressed, stored = on disk), compression\n"
    "ratio, the checkpoint's snapshot records, and the stored schema (components\n"
    "and fields).\n"
    "\n"
    "  --json   one JSON object instead of text\n"
    "\n"
    "Exit status: 0; 1 when some WAL record is invalid (counted, see verify);\n"
    "2 bad arguments or the directory cannot be opened.\n";

#define KIND_SLOTS 32

typedef struct tally {
    uint64_t records, raw, stored; /* payload bytes */
} tally;

typedef struct info {
    tally kind[KIND_SLOTS];
    tally all, snap;
    uint64_t invalid;          /* WAL records failing the record check */
    uint64_t first_lsn, last_lsn;
    uint64_t min_tick, max_tick;  /* over non-SCHEMA records */
    bool any_tick;
    bool any_commit;
    uint64_t last_commit_tick; /* largest tick of a non-HOOK TICK_COMMIT */
} info;

static void add(tally *t, const kw_header *h)
{
    t->records++;
    t->raw += h->raw_len;
    t->stored += h->stored_len;
}

static void scan_record(info *in, const kw_record *r)
{
    const kw_header *h = &r->h;
    add(&in->all, h);
    add(&in->kind[h->kind % KIND_SLOTS], h);
    if (h->kind != KW_KIND_SCHEMA) {
        if (!in->any_tick || h->tick < in->min_tick)
            in->min_tick = h->tick;
        if (!in->any_tick || h->tick > in->max_tick)
            in->max_tick = h->tick;
        in->any_tick = true;
    }
    if (h->kind == KW_KIND_TICK_COMMIT && !(h->flags & KW_FLAG_HOOK) &&
        (!in->any_commit || h->tick > in->last_commit_tick)) {
        in->last_commit_tick = h->tick;
        in->any_commit = true;
    }
}

static int scan_wal(kwt_dir *d, kw_rtxn *r, info *in)
{
    uint64_t count = 0;
    if (kw_wal_bounds(r, &in->first_lsn, &in->last_lsn, &count) == KEEL_ENOENT)
        return KWT_EXIT_OK;
    kw_scan *s;
    if (kw_scan_begin(r, NULL, &s)) {
        kwt_err(d->path, "%s", keel_last_error());
        return KWT_EXIT_USAGE;
    }
    kwt_progress p;
    kwt_progress_begin(&p, "info: reading records", count);
    kw_record rec;
    uint64_t n = 0;
    int rc;
    while ((rc = kwt_scan_next(s, &rec)) > 0) {
        kwt_progress_step(&p, ++n);
        if (rc == KWT_SCAN_INVALID)
            in->invalid++;
        else
            scan_record(in, &rec);
    }
    kwt_progress_end(&p);
    kw_scan_end(s);
    if (rc < 0) {
        kwt_err(d->path, "%s", keel_last_error());
        return KWT_EXIT_PROBLEM;
    }
    return KWT_EXIT_OK;
}

static void scan_snap(kw_rtxn *r, info *in)
{
    kw_walit *it;
    const void *k, *v;
    size_t kl, vl;
    kw_header h;
    if (kw_db_iter(r, KW_DB_SNAP, NULL, 0, &it))
        return;
    while (kw_db_next(it, &k, &kl, &v, &vl) == 1)
        if (!kw_record_check(v, vl, &h))
            add(&in->snap, &h);
    kw_wal_iter_end(it);
}

static double ratio(const tally *t)
{
    return t->stored ? (double)t->raw / (double)t->stored : 1.0;
}

static void print_time(FILE *f, uint64_t ns)
{
    time_t t = (time_t)(ns / 1000000000u);
    struct tm tm;
    char buf[64];
    if (gmtime_r(&t, &tm) && strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm))
        fputs(buf, f);
    else
        fputs("?", f);
}

static void print_text(const kwt_dir *d, const info *in)
{
    printf("directory    %s\n", d->path);
    printf("format       %u (record magic %s)\n", KEEL_WAL_FORMAT_VERSION, KEEL_WAL_MAGIC);
    printf("data file    %" PRIu64 " bytes (data.mdb)\n", kw_store_file_size(d->store));
    if (d->replicated)
        printf("stream       %s (the directory of a replicated world)\n", d->stream_name);
    if (d->has_checkpoint) {
        printf("checkpoint   tick %" PRIu64 ", covers LSN <= %" PRIu64 ", number %u, taken ", d->checkpoint.tick,
               d->checkpoint.lsn, d->checkpoint.count);
        print_time(stdout, d->checkpoint.created_ns);
        printf("\n");
    } else {
        printf("checkpoint   %s\n", d->checkpoint_error[0] ? d->checkpoint_error : "none");
    }
    printf("snapshot     %" PRIu64 " records, %" PRIu64 " bytes raw, %" PRIu64 " stored\n", in->snap.records,
           in->snap.raw, in->snap.stored);
    if (!in->all.records && !in->invalid) {
        printf("wal          empty\n");
    } else {
        printf("wal          LSN %" PRIu64 "..%" PRIu64 ", %" PRIu64 " records", in->first_lsn, in->last_lsn,
               in->all.records + in->invalid);
        if (in->invalid)
            printf(" (%" PRIu64 " INVALID: run keel-wal verify)", in->invalid);
        printf("\n");
        if (in->any_tick)
            printf("ticks        %" PRIu64 "..%" PRIu64, in->min_tick, in->max_tick);
        else
            printf("ticks        none");
        if (in->any_commit)
            printf(", last committed tick %" PRIu64, in->last_commit_tick);
        printf("\n");
    }
    printf("records      ");
    bool first = true;
    for (uint32_t k = 1; k < KIND_SLOTS; k++) {
        if (!strcmp(kw_kind_name(k), "?") || k >= KW_KIND_SNAP_TABLES)
            continue;
        printf("%s%s %" PRIu64, first ? "" : ", ", kw_kind_name(k), in->kind[k].records);
        first = false;
    }
    printf("\n");
    printf("bytes        %" PRIu64 " raw, %" PRIu64 " stored (payloads; +%u-byte header per record: %" PRIu64
           " total)\n", in->all.raw, in->all.stored, KW_HEADER_SIZE,
           in->all.stored + (uint64_t)KW_HEADER_SIZE * in->all.records);
    printf("compression  %.2fx\n", ratio(&in->all));
    if (!d->has_schema) {
        printf("schema       %s\n", d->schema_error[0] ? d->schema_error : "none stored yet");
        return;
    }
    printf("schema       %u components\n", d->schema.ncomps);
    for (uint32_t i = 0; i < d->schema.ncomps; i++) {
        const kw_component *c = &d->schema.comps[i];
        printf("  %3u %-16s size %u, align %u, %s", c->id, c->name, c->size, c->align,
               kwt_discipline_name(c->discipline));
        printf(c->size ? "\n" : ", tag\n");
        for (uint32_t j = 0; j < c->nfields; j++) {
            const kw_field *fl = &c->fields[j];
            printf("        %-16s %s", fl->name, kwt_type_name(fl->type));
            if (fl->count > 1)
                printf("[%u]", fl->count);
            printf(" @%u\n", fl->offset);
        }
    }
}

static void json_tally(const tally *t)
{
    printf("{\"records\":%" PRIu64 ",\"raw_bytes\":%" PRIu64 ",\"stored_bytes\":%" PRIu64 "}", t->records, t->raw,
           t->stored);
}

static void print_json(const kwt_dir *d, const info *in)
{
    printf("{\"dir\":");
    kwt_json_string(stdout, d->path);
    printf(",\"format\":%u,\"data_file_bytes\":%" PRIu64, KEEL_WAL_FORMAT_VERSION, kw_store_file_size(d->store));
    printf(",\"stream\":");
    if (d->replicated)
        kwt_json_string(stdout, d->stream_name);
    else
        printf("null");
    printf(",\"checkpoint\":");
    if (d->has_checkpoint)
        printf("{\"tick\":%" PRIu64 ",\"lsn\":%" PRIu64 ",\"count\":%u,\"created_ns\":%" PRIu64 "}", d->checkpoint.tick,
               d->checkpoint.lsn, d->checkpoint.count, d->checkpoint.created_ns);
    else
        printf("null");
    printf(",\"snapshot\":");
    json_tally(&in->snap);
    printf(",\"wal\":{\"records\":%" PRIu64 ",\"invalid\":%" PRIu64, in->all.records + in->invalid, in->invalid);
    if (in->all.records || in->invalid)
        printf(",\"first_lsn\":%" PRIu64 ",\"last_lsn\":%" PRIu64, in->first_lsn, in->last_lsn);
    if (in->any_tick)
        printf(",\"first_tick\":%" PRIu64 ",\"last_tick\":%" PRIu64, in->min_tick, in->max_tick);
    if (in->any_commit)
        printf(",\"last_committed_tick\":%" PRIu64, in->last_commit_tick);
    printf(",\"raw_bytes\":%" PRIu64 ",\"stored_bytes\":%" PRIu64 ",\"ratio\":%.4f,\"kinds\":{", in->all.raw,
           in->all.stored, ratio(&in->all));
    bool first = true;
    for (uint32_t k = 1; k < KW_KIND_SNAP_TABLES; k++) {
        if (!strcmp(kw_kind_name(k), "?"))
            continue;
        printf("%s\"%s\":", first ? "" : ",", kw_kind_name(k));
        json_tally(&in->kind[k]);
        first = false;
    }
    printf("}},\"schema\":");
    if (d->has_schema)
        kwt_json_schema(stdout, &d->schema);
    else
        printf("null");
    printf("}\n");
}

typedef struct info_opts {
    const char *dir;
    bool json;
} info_opts;

static int parse_args(int argc, char **argv, void *opts)
{
    info_opts *o = opts;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            o->json = true;
        else if (kwt_arg_dir("info", argv[i], &o->dir))
            return KWT_EXIT_USAGE;
    }
    return kwt_need_dir("info", o->dir);
}

static int run(kwt_dir *d, void *opts)
{
    const info_opts *o = opts;
    kw_rtxn *r;
    int rc = kwt_read_begin(d, &r);
    if (rc)
        return rc;
    info in = {0};
    rc = scan_wal(d, r, &in);
    scan_snap(r, &in);
    kw_read_end(r);
    if (rc)
        return rc;
    if (o->json)
        print_json(d, &in);
    else
        print_text(d, &in);
    return in.invalid ? KWT_EXIT_PROBLEM : KWT_EXIT_OK;
}

int kwt_cmd_info(int argc, char **argv)
{
    info_opts o = {0};
    return kwt_run_on_dir(argc, argv, info_help, parse_args, &o, &o.dir, run);
}
