/*
 * tools/keel-wal/verify.c -- `keel-wal verify DIR`: check everything
 * recovery relies on, without a world, and name each problem.
 *
 * One read transaction (a consistent snapshot beside a live server):
 *   - every WAL record: the record check (magic, version, kind, lengths,
 *     CRC32C), header LSN = key, a payload that decompresses and decodes
 *     (changes against the stored schema's component sizes);
 *   - LSN continuity: the WAL starts at 1, or at or below the checkpoint's
 *     covered LSN + 1, and has no gap;
 *   - units as recovery reads them: TICK_CHUNK/LIFECYCLE records of one
 *     tick and HOOK flag, closed by a TICK_COMMIT whose nrecords matches; no
 *     SIDE or SIDES record inside a unit; no unit left open at the end;
 *   - tick monotonicity: unit ticks never decrease in LSN order; a side
 *     record's tick is not below the last unit's (after a crash a side
 *     transaction may carry a lower tick than one before the crash, so
 *     side ticks are not compared with each other);
 *   - checkpoint consistency: meta "checkpoint" decodes; the last
 *     CHECKPOINT marker in the WAL equals it; each marker's covered LSN is
 *     below its own LSN, and the units on either side of the covered LSN
 *     belong to ticks <= / > its tick; the snap records are valid records of
 *     the kind their key names, no newer than the checkpoint, decode, and
 *     agree with the table list (slot pages, live count, rows per table);
 *     no snap records without a checkpoint;
 *   - schema: the stored schema decodes, and equals the last SCHEMA record
 *     of the WAL when one is there.
 * Problems go to stdout as "LSN <n>: <why>" (or "<what>: <why>" when no
 * LSN applies), then one summary line.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "kwt.h"

static const char verify_help[] =
    "usage: keel-wal verify DIR\n"
    "\n"
    "Check every WAL record (magic, CRC32C, header, decompression, decodability\n"
    "against the stored schema), LSN continuity, unit structure (each tick's records\n"
    "closed by its tick_commit), tick monotonicity, and checkpoint consistency (meta,\n"
    "the checkpoint marker, the snapshot records). Each problem is printed on stdout\n"
    "as 'LSN <n>: <reason>' (or '<where>: <reason>'), then a summary line.\n"
    "\n"
    "Exit status: 0 valid; 1 problems found; 2 bad arguments or the directory\n"
    "cannot be opened.\n";

typedef struct commit_pt {
    uint64_t lsn, tick;
} commit_pt;

typedef struct marker {
    uint64_t lsn, covered, tick;
} marker;

typedef struct verifier {
    kwt_dir *d;
    uint64_t problems;
    uint64_t records, snap_records;
    uint64_t first_lsn, prev_lsn;
    bool any;
    /* the open unit */
    uint32_t unit_n;
    uint64_t unit_tick, unit_first;
    uint32_t unit_flags;
    uint32_t unit_invalid;     /* invalid records since the last commit: maybe the unit's */
    uint64_t epoch;            /* the last EPOCH record's epoch (0 before any) */
    /* the last closed unit */
    bool any_unit;
    uint64_t last_unit_tick;
    /* unit commits and checkpoint markers, in LSN order */
    commit_pt *commits;
    size_t ncommits, capcommits;
    marker *markers;
    size_t nmarkers, capmarkers;
    /* the last SCHEMA record of the WAL */
    unsigned char *schema_rec;
    size_t schema_len;
    uint64_t schema_lsn;
    kw_decoder dec;
    FILE *out;                 /* where problems go: stdout (verify), stderr (restore's check) */
} verifier;

static void vproblem(verifier *v, const char *where, const char *fmt, va_list ap)
{
    fprintf(v->out, "%s: ", where);
    vfprintf(v->out, fmt, ap);
    fputc('\n', v->out);
    v->problems++;
}

/* A problem of the record at lsn: "LSN <lsn>: <why>". */
static void problem(verifier *v, uint64_t lsn, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void problem(verifier *v, uint64_t lsn, const char *fmt, ...)
{
    char where[32];
    va_list ap;
    snprintf(where, sizeof where, "LSN %" PRIu64, lsn);
    va_start(ap, fmt);
    vproblem(v, where, fmt, ap);
    va_end(ap);
}

/* A problem of something else ("meta", "snap C table 1 chunk 0" ...). */
static void problem_at(verifier *v, const char *where, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void problem_at(verifier *v, const char *where, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vproblem(v, where, fmt, ap);
    va_end(ap);
}

static bool push(void **arr, size_t *n, size_t *cap, size_t size, const void *item)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 256;
        void *p = realloc(*arr, c * size);
        if (!p)
            return false;
        *arr = p;
        *cap = c;
    }
    memcpy((char *)*arr + *n * size, item, size);
    ++*n;
    return true;
}

/* ---- one WAL record ------------------------------------------------------------------- */

static void check_continuity(verifier *v, uint64_t lsn)
{
    const kwt_dir *d = v->d;
    if (!v->any) {
        v->first_lsn = lsn;
        uint64_t start = d->has_checkpoint ? d->checkpoint.lsn + 1 : 1;
        if (lsn > start)
            problem(v, lsn, "the WAL starts here, but LSNs %" PRIu64 "..%" PRIu64 " are missing (%s)", start, lsn - 1,
                    d->has_checkpoint ? "the checkpoint covers only up to the one before them"
                                      : "without a checkpoint the WAL starts at LSN 1");
    } else if (lsn != v->prev_lsn + 1) {
        problem(v, lsn, "LSNs are not consecutive: %" PRIu64 "..%" PRIu64 " are missing", v->prev_lsn + 1, lsn - 1);
    }
    v->any = true;
    v->prev_lsn = lsn;
}

static int decode_part(void *arg, const kw_header *h, const void *payload)
{
    verifier *v = arg;
    const kwt_dir *d = v->d;
    kw_change c;
    int rc = kw_decode_record(&v->dec, h, payload, d->has_schema ? &d->schema : NULL);
    if (rc)
        return rc;
    while ((rc = kw_decode_next(&v->dec, &c)) == 1)
        ;
    return rc;
}

/* Every change decodes (each transaction of a SIDES record). */
static int decode_changes(verifier *v, const kw_record *r, const void *payload)
{
    return kw_each_part(&r->h, payload, decode_part, v);
}

static void unit_record(verifier *v, const kw_record *r)
{
    const kw_header *h = &r->h;
    if (v->unit_n && (h->tick != v->unit_tick || (h->flags & KW_FLAG_HOOK) != (v->unit_flags & KW_FLAG_HOOK)))
        problem(v, r->lsn, "a %s record of tick %" PRIu64 "%s inside the unit of tick %" PRIu64 "%s opened at LSN %" PRIu64,
                kw_kind_name(h->kind), h->tick, h->flags & KW_FLAG_HOOK ? " (hook)" : "", v->unit_tick,
                v->unit_flags & KW_FLAG_HOOK ? " (hook)" : "", v->unit_first);
    if (!v->unit_n++) {
        v->unit_tick = h->tick;
        v->unit_flags = h->flags;
        v->unit_first = r->lsn;
    }
}

static void unit_commit(verifier *v, const kw_record *r, const void *payload)
{
    const kw_header *h = &r->h;
    kw_commit_info ci;
    if (kw_decode_commit(payload, h->raw_len, &ci)) {
        problem(v, r->lsn, "%s", keel_last_error());
    } else if (ci.nrecords < v->unit_n || ci.nrecords > v->unit_n + v->unit_invalid) {
        problem(v, r->lsn, "the tick_commit of tick %" PRIu64 " counts %u records, %u precede it", h->tick,
                ci.nrecords, v->unit_n);
    } else if (v->unit_n && (h->tick != v->unit_tick || (h->flags & KW_FLAG_HOOK) != (v->unit_flags & KW_FLAG_HOOK))) {
        problem(v, r->lsn, "the tick_commit of tick %" PRIu64 " closes a unit of tick %" PRIu64 " opened at LSN %" PRIu64
                ", or their hook flags differ", h->tick, v->unit_tick, v->unit_first);
    }
    if (v->any_unit && h->tick < v->last_unit_tick)
        problem(v, r->lsn, "tick goes backwards: a unit of tick %" PRIu64 " after one of tick %" PRIu64, h->tick,
                v->last_unit_tick);
    v->any_unit = true;
    v->last_unit_tick = h->tick;
    v->unit_n = 0;
    v->unit_invalid = 0;
    commit_pt c = {r->lsn, h->tick};
    if (!push((void **)&v->commits, &v->ncommits, &v->capcommits, sizeof c, &c)) {
        kwt_note_out_of_memory();
        problem(v, r->lsn, "out of memory recording unit commits");
    }
}

/* A new primary's epoch: epochs only grow, and a unit left open before it
 * was never committed (its primary was deposed mid-tick): it is dropped, as
 * replay drops it. */
static void epoch_record(verifier *v, const kw_record *r, const void *payload)
{
    kw_epoch e;
    if (kw_epoch_decode(payload, r->h.raw_len, &e)) {
        problem(v, r->lsn, "%s", keel_last_error());
        return;
    }
    if (e.epoch <= v->epoch)
        problem(v, r->lsn, "epoch %" PRIu64 " after epoch %" PRIu64 " (epochs only grow)", e.epoch, v->epoch);
    v->epoch = e.epoch;
    v->unit_n = 0;
    v->unit_invalid = 0;
}

static void side_record(verifier *v, const kw_record *r)
{
    if (v->unit_n)
        problem(v, r->lsn, "a side record inside the unit of tick %" PRIu64 " opened at LSN %" PRIu64, v->unit_tick,
                v->unit_first);
    if (v->any_unit && r->h.tick < v->last_unit_tick)
        problem(v, r->lsn, "tick goes backwards: a side record of tick %" PRIu64 " after the unit of tick %" PRIu64,
                r->h.tick, v->last_unit_tick);
}

static void checkpoint_record(verifier *v, const kw_record *r, const void *payload)
{
    kw_cursor c = kw_cursor_make(payload, r->h.raw_len);
    marker m = {.lsn = r->lsn, .covered = kw_get_u64(&c), .tick = kw_get_u64(&c)};
    if (c.bad || !kw_cursor_done(&c)) {
        problem(v, r->lsn, "a checkpoint marker of %u bytes (16 expected)", r->h.raw_len);
        return;
    }
    if (m.tick != r->h.tick)
        problem(v, r->lsn, "the checkpoint marker's header says tick %" PRIu64 ", its payload tick %" PRIu64, r->h.tick,
                m.tick);
    if (m.covered >= m.lsn)
        problem(v, r->lsn, "the checkpoint marker covers LSN %" PRIu64 ", not below its own", m.covered);
    if (v->nmarkers && (m.covered < v->markers[v->nmarkers - 1].covered || m.tick < v->markers[v->nmarkers - 1].tick))
        problem(v, r->lsn, "checkpoint (tick %" PRIu64 ", LSN %" PRIu64 ") is older than the one at LSN %" PRIu64,
                m.tick, m.covered, v->markers[v->nmarkers - 1].lsn);
    if (!push((void **)&v->markers, &v->nmarkers, &v->capmarkers, sizeof m, &m)) {
        kwt_note_out_of_memory();
        problem(v, r->lsn, "out of memory recording checkpoint markers");
    }
}

static void schema_record(verifier *v, const kw_record *r, const void *payload)
{
    kw_schema s;
    if (kw_schema_decode(payload, r->h.raw_len, &s)) {
        problem(v, r->lsn, "%s", keel_last_error());
        return;
    }
    kw_schema_free(&s);
    unsigned char *copy = malloc(r->len);
    if (!copy) { /* the stored schema would go unchecked against it */
        kwt_note_out_of_memory();
        problem(v, r->lsn, "out of memory keeping the schema record");
        return;
    }
    memcpy(copy, r->rec, r->len);
    free(v->schema_rec);
    v->schema_rec = copy;
    v->schema_len = r->len;
    v->schema_lsn = r->lsn;
}

static void check_record(verifier *v, const kw_record *r)
{
    const void *payload;
    if (kwt_payload(v->d, r, &payload)) {
        problem(v, r->lsn, "%s", keel_last_error());
        return;
    }
    switch (r->h.kind) {
    case KW_KIND_TICK_CHUNK:
    case KW_KIND_LIFECYCLE:
        if (decode_changes(v, r, payload))
            problem(v, r->lsn, "%s", keel_last_error());
        unit_record(v, r);
        break;
    case KW_KIND_TICK_COMMIT:
        unit_commit(v, r, payload);
        break;
    case KW_KIND_SIDE:
    case KW_KIND_SIDES:
        if (decode_changes(v, r, payload))
            problem(v, r->lsn, "%s", keel_last_error());
        side_record(v, r);
        break;
    case KW_KIND_CHECKPOINT:
        checkpoint_record(v, r, payload);
        break;
    case KW_KIND_SCHEMA:
        schema_record(v, r, payload);
        break;
    case KW_KIND_EPOCH:
        epoch_record(v, r, payload);
        break;
    default:
        problem(v, r->lsn, "a %s record in the WAL (it belongs in the snap database)", kw_kind_name(r->h.kind));
        break;
    }
    bool unit = r->h.kind == KW_KIND_TICK_COMMIT || r->h.kind == KW_KIND_TICK_CHUNK || r->h.kind == KW_KIND_LIFECYCLE;
    uint32_t allowed = r->h.kind == KW_KIND_SIDE ? KW_FLAG_KEY : 0;
    if (!unit && (r->h.flags & ~allowed))
        problem(v, r->lsn, "a %s record with flags %u (only unit records carry HOOK, only side records KEY)",
                kw_kind_name(r->h.kind), r->h.flags);
}

static int scan_wal(verifier *v, kw_rtxn *r)
{
    uint64_t count = 0, first, last;
    kw_wal_bounds(r, &first, &last, &count);
    kw_scan *s;
    if (kw_scan_begin(r, NULL, &s)) {
        kwt_err(v->d->path, "%s", keel_last_error());
        return KWT_EXIT_USAGE;
    }
    kwt_progress p;
    kwt_progress_begin(&p, "verify: WAL records", count);
    kw_record rec;
    int rc;
    while ((rc = kwt_scan_next(s, &rec)) > 0) {
        kwt_progress_step(&p, ++v->records);
        check_continuity(v, rec.lsn);
        if (rc == KWT_SCAN_INVALID) {
            problem(v, rec.lsn, "%s", keel_last_error());
            v->unit_invalid++; /* its kind is unknown: do not also blame its unit's count */
        } else {
            check_record(v, &rec);
        }
    }
    kwt_progress_end(&p);
    kw_scan_end(s);
    if (rc < 0)
        problem_at(v, "wal", "the scan stopped after LSN %" PRIu64 ": %s", v->prev_lsn, keel_last_error());
    if (v->unit_n)
        problem(v, v->unit_first, "a unit of tick %" PRIu64 " with %u records has no tick_commit (a torn tail)",
                v->unit_tick, v->unit_n);
    return KWT_EXIT_OK;
}

/* ---- checkpoint consistency ------------------------------------------------------------ */

/* The last unit commit with LSN <= lsn, NULL when none. */
static const commit_pt *commit_upto(const verifier *v, uint64_t lsn)
{
    size_t lo = 0, hi = v->ncommits;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v->commits[mid].lsn <= lsn)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo ? &v->commits[lo - 1] : NULL;
}

static void check_markers(verifier *v)
{
    const kwt_dir *d = v->d;
    for (size_t i = 0; i < v->nmarkers; i++) {
        const marker *m = &v->markers[i];
        const commit_pt *before = commit_upto(v, m->covered);
        const commit_pt *after = before ? before + 1 : v->ncommits ? v->commits : NULL;
        if (before && before->tick > m->tick)
            problem(v, m->lsn, "the checkpoint of tick %" PRIu64 " covers LSN %" PRIu64 ", which includes the unit of "
                    "tick %" PRIu64 " at LSN %" PRIu64, m->tick, m->covered, before->tick, before->lsn);
        if (after && after < v->commits + v->ncommits && after->tick <= m->tick)
            problem(v, m->lsn, "the checkpoint of tick %" PRIu64 " covers LSN %" PRIu64 ", but the unit of tick "
                    "%" PRIu64 " at LSN %" PRIu64 " comes after it (replay would apply it twice)", m->tick, m->covered,
                    after->tick, after->lsn);
    }
    if (d->replicated) { /* markers are the primaries': meta (if any) only has to lie within the WAL */
        if (d->checkpoint_error[0])
            problem_at(v, "meta", "%s", d->checkpoint_error);
        else if (d->has_checkpoint && v->any && v->prev_lsn < d->checkpoint.lsn)
            problem_at(v, "meta", "the checkpoint covers LSN %" PRIu64 ", beyond the WAL's last LSN %" PRIu64,
                       d->checkpoint.lsn, v->prev_lsn);
        return;
    }
    if (!d->has_checkpoint) {
        if (d->checkpoint_error[0])
            problem_at(v, "meta", "%s", d->checkpoint_error);
        else if (v->nmarkers)
            problem(v, v->markers[v->nmarkers - 1].lsn, "a checkpoint marker, but meta records no checkpoint");
        return;
    }
    const marker *m = v->nmarkers ? &v->markers[v->nmarkers - 1] : NULL;
    if (!m)
        problem_at(v, "meta", "the checkpoint of tick %" PRIu64 " (covered LSN %" PRIu64 ") has no marker in the WAL",
                   d->checkpoint.tick, d->checkpoint.lsn);
    else if (m->tick != d->checkpoint.tick || m->covered != d->checkpoint.lsn)
        problem(v, m->lsn, "the last checkpoint marker (tick %" PRIu64 ", covered LSN %" PRIu64 ") differs from meta "
                "(tick %" PRIu64 ", covered LSN %" PRIu64 ")", m->tick, m->covered, d->checkpoint.tick,
                d->checkpoint.lsn);
    if (v->any && v->prev_lsn <= d->checkpoint.lsn)
        problem_at(v, "meta", "the checkpoint covers LSN %" PRIu64 ", beyond the WAL's last LSN %" PRIu64,
                   d->checkpoint.lsn, v->prev_lsn);
}

/* What the table list says, for the slot pages and chunks to agree with. */
typedef struct snap_expect {
    bool have_tables;
    uint32_t ntables, nslots, nlive;
    uint32_t *rows;            /* per table */
    uint64_t *rows_seen;       /* per table, summed over chunks */
    uint32_t pages_seen, live_seen;
} snap_expect;

static void snap_key_name(const unsigned char *k, size_t kl, char *buf, size_t n)
{
    uint32_t a = 0, b = 0;
    for (size_t i = 1; i < 5 && i < kl; i++)
        a = a << 8 | k[i];
    for (size_t i = 5; i < 9 && i < kl; i++)
        b = b << 8 | k[i];
    if (kl == 1 && (k[0] == 'T' || k[0] == 'K'))
        snprintf(buf, n, "snap %c", k[0]);
    else if (kl == 5 && k[0] == 'S')
        snprintf(buf, n, "snap S page %u", a);
    else if (kl == 9 && k[0] == 'C')
        snprintf(buf, n, "snap C table %u chunk %u", a, b);
    else
        snprintf(buf, n, "snap key of %zu bytes starting 0x%02x", kl, kl ? k[0] : 0);
}

static void check_tables(verifier *v, const char *where, const void *p, size_t n, snap_expect *e)
{
    kw_snap_tables t;
    static kw_snap_table tb;
    int rc = kw_snap_tables_begin(&t, p, n);
    if (rc) {
        problem_at(v, where, "%s", keel_last_error());
        return;
    }
    e->rows = calloc(t.ntables + 1u, sizeof *e->rows);
    e->rows_seen = calloc(t.ntables + 1u, sizeof *e->rows_seen);
    if (!e->rows || !e->rows_seen) {
        kwt_note_out_of_memory();
        problem_at(v, where, "out of memory for %u tables", t.ntables);
        return;
    }
    while ((rc = kw_snap_tables_next(&t, &tb)) == 1) {
        e->rows[t.next - 1] = tb.rows;
        for (uint32_t i = 0; i < tb.ncols; i++)
            if (v->d->has_schema && !kw_schema_get(&v->d->schema, tb.comps[i]))
                problem_at(v, where, "table %u has component %u, which the stored schema lacks", t.next - 1,
                           tb.comps[i]);
    }
    if (rc) {
        problem_at(v, where, "%s", keel_last_error());
        return;
    }
    e->have_tables = true;
    e->ntables = t.ntables;
    e->nslots = t.nslots;
    e->nlive = t.nlive;
}

static void check_slots(verifier *v, const char *where, uint32_t page, const void *p, size_t n, snap_expect *e)
{
    kw_snap_slots s;
    if (kw_snap_slots_decode(p, n, &s)) {
        problem_at(v, where, "%s", keel_last_error());
        return;
    }
    if (s.first != page * KW_SNAP_PAGE_SLOTS)
        problem_at(v, where, "the page starts at slot %u, its key says %u", s.first, page * KW_SNAP_PAGE_SLOTS);
    for (uint32_t i = 0; i < s.n; i++) {
        if (s.live[i] > 1)
            problem_at(v, where, "slot %u has liveness byte %u", s.first + i, s.live[i]);
        e->live_seen += s.live[i] == 1;
    }
    e->pages_seen++;
    if (e->have_tables) {
        uint64_t want = e->nslots > s.first ? e->nslots - s.first : 0;
        if (want > KW_SNAP_PAGE_SLOTS)
            want = KW_SNAP_PAGE_SLOTS;
        if (s.n != want)
            problem_at(v, where, "the page holds %u slots; the table list's %u slots give %" PRIu64, s.n, e->nslots,
                       want);
    }
}

static void check_chunk(verifier *v, const char *where, const unsigned char *key, const void *p, size_t n,
                        snap_expect *e)
{
    static kw_snap_chunk c;
    if (kw_snap_chunk_decode(p, n, &c)) {
        problem_at(v, where, "%s", keel_last_error());
        return;
    }
    uint32_t table = (uint32_t)key[1] << 24 | (uint32_t)key[2] << 16 | (uint32_t)key[3] << 8 | key[4];
    uint32_t chunk = (uint32_t)key[5] << 24 | (uint32_t)key[6] << 16 | (uint32_t)key[7] << 8 | key[8];
    if (c.table != table || c.chunk != chunk)
        problem_at(v, where, "the record says table %u chunk %u", c.table, c.chunk);
    for (uint32_t i = 0; i < c.ncols; i++) {
        const kw_component *comp = v->d->has_schema ? kw_schema_get(&v->d->schema, c.comps[i]) : NULL;
        if (v->d->has_schema && (!comp || comp->size != c.sizes[i]))
            problem_at(v, where, "column %u: component %u of %u bytes does not match the stored schema", i,
                       c.comps[i], c.sizes[i]);
    }
    if (e->have_tables) {
        if (c.table >= e->ntables)
            problem_at(v, where, "table %u is beyond the table list's %u tables", c.table, e->ntables);
        else
            e->rows_seen[c.table] += c.count;
    }
}

static void check_snap_record(verifier *v, const void *k, size_t kl, const void *val, size_t vl, snap_expect *e)
{
    const unsigned char *key = k;
    char where[96];
    kw_header h;
    const void *p;
    size_t n;
    snap_key_name(key, kl, where, sizeof where);
    uint32_t kind = kl == 1 && key[0] == 'T'   ? KW_KIND_SNAP_TABLES
                  : kl == 5 && key[0] == 'S'   ? KW_KIND_SNAP_SLOTS
                  : kl == 9 && key[0] == 'C'   ? KW_KIND_SNAP_CHUNK
                  : kl == 1 && key[0] == 'K'   ? KW_KIND_SNAP_KEYS
                                               : 0;
    v->snap_records++;
    if (!kind) {
        problem_at(v, where, "not a key keel writes");
        return;
    }
    if (kw_snap_payload(v->d->codec, val, vl, kind, &p, &n)) {
        problem_at(v, where, "%s", keel_last_error());
        return;
    }
    kw_record_check(val, vl, &h);
    if (h.lsn != 0)
        problem_at(v, where, "a snap record with LSN %" PRIu64 " (snap records have LSN 0)", h.lsn);
    if (v->d->has_checkpoint && h.tick > v->d->checkpoint.tick)
        problem_at(v, where, "written at tick %" PRIu64 ", after the checkpoint's tick %" PRIu64, h.tick,
                   v->d->checkpoint.tick);
    kw_snap_keys keys;
    if (kind == KW_KIND_SNAP_KEYS) {
        if (kw_snap_keys_decode(p, n, &keys))
            problem_at(v, where, "%s", keel_last_error());
    } else if (kind == KW_KIND_SNAP_TABLES)
        check_tables(v, where, p, n, e);
    else if (kind == KW_KIND_SNAP_SLOTS)
        check_slots(v, where, (uint32_t)key[1] << 24 | (uint32_t)key[2] << 16 | (uint32_t)key[3] << 8 | key[4], p,
                    n, e);
    else
        check_chunk(v, where, key, p, n, e);
}

static void snap_totals(verifier *v, const snap_expect *e)
{
    if (!e->have_tables)
        return;
    uint32_t pages = (uint32_t)(((uint64_t)e->nslots + KW_SNAP_PAGE_SLOTS - 1) / KW_SNAP_PAGE_SLOTS);
    if (e->pages_seen != pages)
        problem_at(v, "snap", "%u slot pages for %u slots (%u expected)", e->pages_seen, e->nslots, pages);
    else if (e->live_seen != e->nlive)
        problem_at(v, "snap", "the slot pages hold %u live entities, the table list says %u", e->live_seen, e->nlive);
    for (uint32_t t = 0; t < e->ntables; t++)
        if (e->rows_seen[t] != e->rows[t])
            problem_at(v, "snap", "table %u: its chunks hold %" PRIu64 " rows, the table list says %u", t,
                       e->rows_seen[t], e->rows[t]);
}

static void check_snap(verifier *v, kw_rtxn *r)
{
    kw_walit *it;
    const void *k, *val;
    size_t kl, vl;
    snap_expect e = {0};
    const void *tv;
    size_t tl;
    /* the table list first: the pages and chunks are checked against it */
    if (!kw_get(r, KW_DB_SNAP, "T", 1, &tv, &tl))
        check_snap_record(v, "T", 1, tv, tl, &e);
    else if (v->d->has_checkpoint)
        problem_at(v, "snap", "the checkpoint of tick %" PRIu64 " has no table list (key \"T\")",
                   v->d->checkpoint.tick);
    if (kw_db_iter(r, KW_DB_SNAP, NULL, 0, &it)) {
        problem_at(v, "snap", "%s", keel_last_error());
        return;
    }
    int rc;
    while ((rc = kw_db_next(it, &k, &kl, &val, &vl)) == 1)
        if (!(kl == 1 && *(const char *)k == 'T'))
            check_snap_record(v, k, kl, val, vl, &e);
    if (rc < 0)
        problem_at(v, "snap", "%s", keel_last_error());
    kw_wal_iter_end(it);
    if (v->snap_records && !v->d->has_checkpoint && !v->d->checkpoint_error[0])
        problem_at(v, "snap", "%" PRIu64 " snapshot records, but meta records no checkpoint", v->snap_records);
    snap_totals(v, &e);
    free(e.rows);
    free(e.rows_seen);
}

/* ---- schema ---------------------------------------------------------------------------- */

static void check_schema(verifier *v, kw_rtxn *r)
{
    const kwt_dir *d = v->d;
    const void *val;
    size_t vl;
    if (d->schema_error[0]) {
        problem_at(v, "schema", "%s", d->schema_error);
        return;
    }
    if (kw_get(r, KW_DB_SCHEMA, KW_SCHEMA_KEY, strlen(KW_SCHEMA_KEY), &val, &vl)) {
        if (v->records && v->schema_rec)
            problem_at(v, "schema", "the WAL has a schema record (LSN %" PRIu64 ") but schema/\"components\" is "
                       "missing", v->schema_lsn);
        return;
    }
    if (!v->schema_rec)
        return;
    /* the same bytes apart from the header's LSN (offset 8) and CRC (40) */
    const unsigned char *a = val, *b = v->schema_rec;
    bool same = vl == v->schema_len && !memcmp(a, b, 8) && !memcmp(a + 16, b + 16, 24) &&
                !memcmp(a + 44, b + 44, vl - 44);
    if (!same)
        problem(v, v->schema_lsn, "the WAL's last schema record differs from the stored schema");
}

/* ---- the command ----------------------------------------------------------------------- */

/* Every check, problems one per line to `out`; with summary, verify's
 * summary line on stdout. KWT_EXIT_PROBLEM when any was found. */
static int verify_into(kwt_dir *d, FILE *out, bool summary)
{
    static verifier v; /* the decoder's scratch is 3 KiB */
    memset(&v, 0, sizeof v);
    v.d = d;
    v.out = out;
    kw_rtxn *r;
    int rc = kwt_read_begin(d, &r);
    if (rc)
        return rc;
    kwt_guard_set(d->path, KWT_EXIT_PROBLEM); /* a fault in LMDB now means a damaged file: a finding */
    rc = scan_wal(&v, r);
    if (!rc) {
        check_markers(&v);
        check_snap(&v, r);
        check_schema(&v, r);
    }
    kw_read_end(r);
    kwt_guard_set(NULL, KWT_EXIT_USAGE);
    if (!rc && !summary) {
        rc = v.problems ? KWT_EXIT_PROBLEM : KWT_EXIT_OK;
    } else if (!rc) {
        if (v.any)
            printf("verify: %s: %" PRIu64 " WAL records (LSN %" PRIu64 "..%" PRIu64 "), %" PRIu64 " snapshot records: ",
                   d->path, v.records, v.first_lsn, v.prev_lsn, v.snap_records);
        else
            printf("verify: %s: empty WAL, %" PRIu64 " snapshot records: ", d->path, v.snap_records);
        if (v.problems)
            printf("%" PRIu64 " problem%s\n", v.problems, v.problems == 1 ? "" : "s");
        else
            printf("ok\n");
        rc = v.problems ? KWT_EXIT_PROBLEM : KWT_EXIT_OK;
    }
    free(v.commits);
    free(v.markers);
    free(v.schema_rec);
    return rc;
}

static int verify(kwt_dir *d)
{
    return verify_into(d, stdout, true);
}

int kwt_check_dir(kwt_dir *d)
{
    return verify_into(d, stderr, false);
}

/* verify takes the directory only: opts is its name. */
static int parse_args(int argc, char **argv, void *opts)
{
    const char **dir = opts;
    for (int i = 1; i < argc; i++)
        if (kwt_arg_dir("verify", argv[i], dir))
            return KWT_EXIT_USAGE;
    return kwt_need_dir("verify", *dir);
}

static int run(kwt_dir *d, void *opts)
{
    (void)opts;
    return verify(d);
}

int kwt_cmd_verify(int argc, char **argv)
{
    const char *dir = NULL;
    return kwt_run_on_dir(argc, argv, verify_help, parse_args, &dir, &dir, run);
}
