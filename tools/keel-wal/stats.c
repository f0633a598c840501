/*
 * tools/keel-wal/stats.c -- `keel-wal stats DIR [--json]`: where the WAL's
 * bytes go. Per kind, per component, per tick range, and the ticks with
 * the most bytes, in one pass over one read transaction.
 *
 * Records are compressed whole, so a component's share of the stored
 * bytes is an estimate: its raw value bytes times its record's
 * stored/raw ratio. Kind, tick and total figures are exact and equal what
 * `info` reports.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "kwt.h"

static const char stats_help[] =
    "usage: keel-wal stats DIR [--json] [--top N] [--bucket TICKS]\n"
    "\n"
    "Where the WAL's bytes go: records, raw (uncompressed) and stored payload bytes\n"
    "and the compression ratio per record kind; changes and value bytes per\n"
    "component (stored bytes estimated: a record is compressed whole); the same per\n"
    "tick range; and the ticks with the most stored bytes.\n"
    "\n"
    "  --json          one JSON object instead of text\n"
    "  --top N         how many top ticks to list (default 10)\n"
    "  --bucket TICKS  ticks per range (default: a round width giving at most 20)\n"
    "\n"
    "Exit status: 0; 1 when some WAL record is invalid (counted, skipped);\n"
    "2 bad arguments or the directory cannot be opened.\n";

typedef struct tally {
    uint64_t records, raw, stored;
} tally;

typedef struct comp_tally {
    uint64_t changes, value_bytes;
    double stored_est;
} comp_tally;

typedef struct tick_slot {
    uint64_t key;              /* tick + 1; 0 = empty */
    tally t;
} tick_slot;

typedef struct stats {
    tally all, kind[32];
    comp_tally comp[256];
    uint64_t invalid;
    tick_slot *ticks;
    size_t nticks, capticks;
    uint64_t min_tick, max_tick;
    kw_decoder dec;
} stats;

/* ---- the per-tick map (open addressing, linear probing) ---------------------------------- */

static size_t tick_hash(uint64_t k, size_t cap)
{
    k *= 0x9e3779b97f4a7c15ull;
    return (size_t)(k >> 20) & (cap - 1);
}

static tick_slot *tick_find(stats *st, uint64_t tick)
{
    uint64_t key = tick + 1;
    if (!key)
        key = tick; /* tick UINT64_MAX shares a slot with UINT64_MAX - 1; harmless for statistics */
    if ((st->nticks + 1) * 2 > st->capticks) {
        size_t cap = st->capticks ? st->capticks * 2 : 1024;
        tick_slot *n = calloc(cap, sizeof *n);
        if (!n)
            return NULL;
        for (size_t i = 0; i < st->capticks; i++) {
            if (!st->ticks[i].key)
                continue;
            size_t j = tick_hash(st->ticks[i].key, cap);
            while (n[j].key)
                j = (j + 1) & (cap - 1);
            n[j] = st->ticks[i];
        }
        free(st->ticks);
        st->ticks = n;
        st->capticks = cap;
    }
    size_t j = tick_hash(key, st->capticks);
    while (st->ticks[j].key && st->ticks[j].key != key)
        j = (j + 1) & (st->capticks - 1);
    if (!st->ticks[j].key) {
        st->ticks[j].key = key;
        st->nticks++;
    }
    return &st->ticks[j];
}

/* ---- gathering ------------------------------------------------------------------------ */

static void add(tally *t, const kw_header *h)
{
    t->records++;
    t->raw += h->raw_len;
    t->stored += h->stored_len;
}

static void add_comp(stats *st, uint32_t comp, uint32_t size, double ratio)
{
    comp_tally *c = &st->comp[comp & 255];
    c->changes++;
    c->value_bytes += size;
    c->stored_est += size * ratio;
}

/* Per-component figures of a record with changes; KEEL_E* when it does not decode. */
typedef struct part_count {
    kwt_dir *d;
    stats *st;
    double ratio;              /* the record's stored / raw bytes */
} part_count;

static int count_part(void *arg, const kw_header *h, const void *payload)
{
    part_count *pc = arg;
    stats *st = pc->st;
    kw_change c;
    double ratio = pc->ratio;
    int rc = kw_decode_record(&st->dec, h, payload, pc->d->has_schema ? &pc->d->schema : NULL);
    if (rc)
        return rc;
    while ((rc = kw_decode_next(&st->dec, &c)) == 1) {
        if (c.op == KW_OP_SPAWN)
            for (uint32_t i = 0; i < c.n; i++)
                add_comp(st, c.comps[i], c.sizes[i], ratio);
        else if (c.op != KW_OP_DESTROY)
            add_comp(st, c.component, c.op == KW_OP_REMOVE ? 0 : c.size, ratio);
    }
    return rc;
}

static int count_changes(kwt_dir *d, stats *st, const kw_record *r)
{
    const void *payload;
    int rc = kwt_payload(d, r, &payload);
    if (rc)
        return rc;
    part_count pc = {d, st, r->h.raw_len ? (double)r->h.stored_len / r->h.raw_len : 1.0};
    return kw_each_part(&r->h, payload, count_part, &pc);
}

static int gather(kwt_dir *d, stats *st)
{
    kw_rtxn *r;
    int rc = kwt_read_begin(d, &r);
    if (rc)
        return rc;
    uint64_t count = 0, first, last, n = 0;
    kw_wal_bounds(r, &first, &last, &count);
    kw_scan *s;
    if (kw_scan_begin(r, NULL, &s)) {
        kwt_err(d->path, "%s", keel_last_error());
        kw_read_end(r);
        return KWT_EXIT_USAGE;
    }
    kwt_progress p;
    kwt_progress_begin(&p, "stats: reading records", count);
    kw_record rec;
    while ((rc = kwt_scan_next(s, &rec)) > 0) {
        kwt_progress_step(&p, ++n);
        if (rc == KWT_SCAN_INVALID) {
            st->invalid++;
            continue;
        }
        if (kw_kind_has_changes(rec.h.kind) && count_changes(d, st, &rec)) {
            kwt_err(d->path, "LSN %" PRIu64 ": %s (its changes are not counted)", rec.lsn, keel_last_error());
            st->invalid++;
        }
        add(&st->all, &rec.h);
        add(&st->kind[rec.h.kind & 31], &rec.h);
        tick_slot *t = tick_find(st, rec.h.tick);
        if (t)
            add(&t->t, &rec.h);
        else /* the tick table could not grow: the per-tick figures would miss this record */
            kwt_note_out_of_memory();
        if (st->all.records == 1 || rec.h.tick < st->min_tick)
            st->min_tick = rec.h.tick;
        if (st->all.records == 1 || rec.h.tick > st->max_tick)
            st->max_tick = rec.h.tick;
    }
    kwt_progress_end(&p);
    if (rc < 0) {
        kwt_err(d->path, "%s", keel_last_error());
        st->invalid++;
    }
    kw_scan_end(s);
    kw_read_end(r);
    return KWT_EXIT_OK;
}

/* ---- shaping ---------------------------------------------------------------------------- */

/* A round bucket width (1, 2, 5 x 10^k) giving at most 20 ranges. */
static uint64_t auto_bucket(uint64_t span)
{
    static const uint64_t steps[] = {1, 2, 5};
    for (uint64_t scale = 1;; scale *= 10)
        for (int i = 0; i < 3; i++)
            if (span / (steps[i] * scale) < 20 || scale > UINT64_MAX / 100)
                return steps[i] * scale;
}

static int by_stored_desc(const void *a, const void *b)
{
    const tick_slot *x = a, *y = b;
    if (x->t.stored != y->t.stored)
        return x->t.stored < y->t.stored ? 1 : -1;
    return x->key < y->key ? -1 : x->key > y->key;
}

/* The ticks, sorted by stored bytes (descending); the caller frees. */
static tick_slot *sorted_ticks(const stats *st)
{
    tick_slot *v = malloc((st->nticks + 1) * sizeof *v);
    size_t n = 0;
    if (!v)
        return NULL;
    for (size_t i = 0; i < st->capticks; i++)
        if (st->ticks[i].key)
            v[n++] = st->ticks[i];
    qsort(v, n, sizeof *v, by_stored_desc);
    return v;
}

/* Bucket b covers ticks [base + b*width, base + (b+1)*width). */
static tally *bucketize(const stats *st, uint64_t width, uint64_t *base, size_t *nb)
{
    *base = st->min_tick / width * width;
    *nb = st->all.records ? (size_t)((st->max_tick - *base) / width + 1) : 0;
    tally *b = calloc(*nb + 1, sizeof *b);
    for (size_t i = 0; b && i < st->capticks; i++) {
        const tick_slot *t = &st->ticks[i];
        if (!t->key)
            continue;
        tally *x = &b[(t->key - 1 - *base) / width];
        x->records += t->t.records;
        x->raw += t->t.raw;
        x->stored += t->t.stored;
    }
    return b;
}

static double ratio(uint64_t raw, uint64_t stored)
{
    return stored ? (double)raw / (double)stored : 1.0;
}

/* ---- printing ---------------------------------------------------------------------------- */

static void text_row(const char *name, const tally *t)
{
    printf("  %-22s %10" PRIu64 " %14" PRIu64 " %14" PRIu64 " %7.2fx\n", name, t->records, t->raw, t->stored,
           ratio(t->raw, t->stored));
}

static void table_head(const char *title, const char *a, const char *b, const char *c, const char *d)
{
    printf("\n%-24s %10s %14s %14s %8s\n", title, a, b, c, d);
}

static void print_text(const kwt_dir *d, const stats *st, uint64_t width, const tally *b, uint64_t base, size_t nb,
                       const tick_slot *top, size_t ntop)
{
    char name[64];
    printf("%s: %" PRIu64 " records, %" PRIu64 " bytes raw, %" PRIu64 " stored, ratio %.2fx", d->path,
           st->all.records, st->all.raw, st->all.stored, ratio(st->all.raw, st->all.stored));
    printf(st->invalid ? ", %" PRIu64 " invalid (skipped)\n" : "\n", st->invalid);
    table_head("by kind", "records", "raw bytes", "stored bytes", "ratio");
    for (uint32_t k = 1; k < 32; k++)
        if (st->kind[k].records)
            text_row(kw_kind_name(k), &st->kind[k]);
    table_head("by component", "changes", "value bytes", "stored (est)", "share");
    for (uint32_t c = 1; c < 256; c++) {
        const comp_tally *ct = &st->comp[c];
        if (!ct->changes)
            continue;
        char nb16[16];
        printf("  %-22s %10" PRIu64 " %14" PRIu64 " %14.0f %7.1f%%\n", kwt_comp_name(d, c, nb16), ct->changes,
               ct->value_bytes, ct->stored_est, st->all.stored ? 100.0 * ct->stored_est / st->all.stored : 0.0);
    }
    snprintf(name, sizeof name, "by tick range (%" PRIu64 " tick%s)", width, width == 1 ? "" : "s");
    table_head(name, "records", "raw bytes", "stored bytes", "ratio");
    for (size_t i = 0; i < nb; i++) {
        if (!b[i].records)
            continue;
        if (width == 1)
            snprintf(name, sizeof name, "tick %" PRIu64, base + i);
        else
            snprintf(name, sizeof name, "%" PRIu64 "..%" PRIu64, base + i * width, base + (i + 1) * width - 1);
        text_row(name, &b[i]);
    }
    table_head("top ticks (stored bytes)", "records", "raw bytes", "stored bytes", "ratio");
    for (size_t i = 0; i < ntop; i++) {
        snprintf(name, sizeof name, "tick %" PRIu64, top[i].key - 1);
        text_row(name, &top[i].t);
    }
}

static void json_tally(const tally *t)
{
    printf("\"records\":%" PRIu64 ",\"raw_bytes\":%" PRIu64 ",\"stored_bytes\":%" PRIu64 ",\"ratio\":%.4f", t->records,
           t->raw, t->stored, ratio(t->raw, t->stored));
}

static void print_json(const kwt_dir *d, const stats *st, uint64_t width, const tally *b, uint64_t base, size_t nb,
                       const tick_slot *top, size_t ntop)
{
    printf("{\"dir\":");
    kwt_json_string(stdout, d->path);
    printf(",");
    json_tally(&st->all);
    printf(",\"invalid\":%" PRIu64 ",\"kinds\":{", st->invalid);
    const char *sep = "";
    for (uint32_t k = 1; k < 32; k++) {
        if (!st->kind[k].records)
            continue;
        printf("%s\"%s\":{", sep, kw_kind_name(k));
        json_tally(&st->kind[k]);
        printf("}");
        sep = ",";
    }
    printf("},\"components\":{");
    sep = "";
    for (uint32_t c = 1; c < 256; c++) {
        const comp_tally *ct = &st->comp[c];
        char nb16[16];
        if (!ct->changes)
            continue;
        printf("%s", sep);
        kwt_json_string(stdout, kwt_comp_name(d, c, nb16));
        printf(":{\"id\":%u,\"changes\":%" PRIu64 ",\"value_bytes\":%" PRIu64 ",\"stored_bytes_est\":%.0f}", c,
               ct->changes, ct->value_bytes, ct->stored_est);
        sep = ",";
    }
    printf("},\"bucket_ticks\":%" PRIu64 ",\"tick_ranges\":[", width);
    sep = "";
    for (size_t i = 0; i < nb; i++) {
        if (!b[i].records)
            continue;
        printf("%s{\"from_tick\":%" PRIu64 ",\"to_tick\":%" PRIu64 ",", sep, base + i * width,
               base + (i + 1) * width - 1);
        json_tally(&b[i]);
        printf("}");
        sep = ",";
    }
    printf("],\"top_ticks\":[");
    for (size_t i = 0; i < ntop; i++) {
        printf("%s{\"tick\":%" PRIu64 ",", i ? "," : "", top[i].key - 1);
        json_tally(&top[i].t);
        printf("}");
    }
    printf("]}\n");
}

/* ---- the command ----------------------------------------------------------------------- */

typedef struct stats_opts {
    const char *dir;
    bool json;
    uint64_t top, bucket;
} stats_opts;

static int parse_args(int argc, char **argv, void *opts)
{
    stats_opts *o = opts;
    for (int i = 1; i < argc; i++) {
        int rc;
        if ((rc = kwt_opt_u64("stats", argc, argv, &i, "--top", &o->top))) {
            if (rc < 0)
                return KWT_EXIT_USAGE;
        } else if ((rc = kwt_opt_u64("stats", argc, argv, &i, "--bucket", &o->bucket))) {
            if (rc < 0)
                return KWT_EXIT_USAGE;
            if (!o->bucket) /* 0 inside means "choose a width": refused rather than silently taken */
                return kwt_usage_error("stats", "--bucket needs a width of at least 1 tick");
        } else if (!strcmp(argv[i], "--json")) {
            o->json = true;
        } else if (kwt_arg_dir("stats", argv[i], &o->dir)) {
            return KWT_EXIT_USAGE;
        }
    }
    return kwt_need_dir("stats", o->dir);
}

static int report(const kwt_dir *d, const stats *st, const stats_opts *o)
{
    uint64_t width = o->bucket ? o->bucket : auto_bucket(st->max_tick - st->min_tick);
    uint64_t base;
    size_t nb;
    if (st->all.records && (st->max_tick - st->min_tick) / width > 10000000u) {
        kwt_err(d->path, "--bucket %" PRIu64 " makes more than ten million tick ranges", width);
        return KWT_EXIT_USAGE;
    }
    tally *b = bucketize(st, width, &base, &nb);
    tick_slot *top = sorted_ticks(st);
    if (!b || !top) {
        free(b);
        free(top);
        kwt_err(d->path, "out of memory");
        return KWT_EXIT_USAGE;
    }
    size_t ntop = o->top < st->nticks ? (size_t)o->top : st->nticks;
    if (o->json)
        print_json(d, st, width, b, base, nb, top, ntop);
    else
        print_text(d, st, width, b, base, nb, top, ntop);
    free(b);
    free(top);
    return st->invalid ? KWT_EXIT_PROBLEM : KWT_EXIT_OK;
}

static int run(kwt_dir *d, void *opts)
{
    stats *st = calloc(1, sizeof *st);
    if (!st) {
        kwt_err(d->path, "out of memory");
        return KWT_EXIT_USAGE;
    }
    int rc = gather(d, st);
    if (!rc)
        rc = report(d, st, opts);
    free(st->ticks);
    free(st);
    return rc;
}

int kwt_cmd_stats(int argc, char **argv)
{
    stats_opts o = {.top = 10};
    return kwt_run_on_dir(argc, argv, stats_help, parse_args, &o, &o.dir, run);
}
