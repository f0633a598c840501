/*
 * tools/keel-wal/dump.c -- `keel-wal dump DIR [filters] [--json]`: the WAL
 * records, one per line, in LSN order. Text lines are key=value summaries
 * (grep/awk); --json lines carry the decoded changes with field values by
 * name from the stored schema (jq).
 *
 * A record is decoded completely before anything of it is printed, so a
 * record that fails half-way never leaves half a JSON line.
 */
#include <inttypes.h>
#include <string.h>

#include "kwt.h"

static const char dump_help[] =
    "usage: keel-wal dump DIR [--from-lsn A] [--to-lsn B] [--from-tick A] [--to-tick B]\n"
    "                         [--kind K] [--component NAME] [--entity HANDLE] [--json]\n"
    "\n"
    "Print the WAL's records in LSN order, one per line.\n"
    "\n"
    "  --from-lsn A, --to-lsn B    LSN range, inclusive\n"
    "  --from-tick A, --to-tick B  tick range, inclusive (the record header's tick)\n"
    "  --kind K                    tick_chunk, tick_commit, side, sides, lifecycle, schema,\n"
    "                              checkpoint, epoch (or the number); a comma list or\n"
    "                              repeated\n"
    "  --component NAME            records with a change of this component (name or id)\n"
    "  --entity HANDLE             records with a change of this entity\n"
    "                              (16 hex digits as printed, 0x<hex>, or INDEX:GEN)\n"
    "  --json                      JSON lines: header fields plus the decoded content,\n"
    "                              values by field name\n"
    "\n"
    "With --component or --entity only the matching changes are listed. Text lines\n"
    "are key=value: lsn= tick= kind= flags= codec= raw= stored=, then per kind\n"
    "rows= and per-component row counts (tick_chunk), ops= (lifecycle), seq= mode=\n"
    "writes= (side), nrecords= nlive= nslots= (tick_commit), covered_lsn=\n"
    "checkpoint_tick= (checkpoint), components= (schema).\n"
    "\n"
    "Exit status: 0; 1 when some record is invalid (reported on stderr, skipped);\n"
    "2 bad arguments or the directory cannot be opened.\n";

typedef struct dump_opts {
    const char *dir;
    uint64_t from_lsn, to_lsn, from_tick, to_tick;
    bool has_to_lsn, has_to_tick;
    uint32_t kinds;            /* mask of 1u << kind; 0 = every kind */
    const char *component_name;
    uint32_t component;        /* 0 = any */
    bool has_entity;
    uint64_t entity;
    bool json;
} dump_opts;

static const char *const op_names[] = {"set", "spawn", "destroy", "add", "remove"};

static const char *mode_name(uint32_t mode)
{
    static const char *const names[] = {"?", "immediate", "group", "deferred"};
    return names[mode < 4 ? mode : 0];
}

/* ---- arguments ------------------------------------------------------------------- */

static int parse_kinds(const char *list, uint32_t *mask)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        uint64_t k = kw_kind_parse(t);
        if (!k && (!kwt_parse_u64(t, &k) || !strcmp(kw_kind_name((uint32_t)k), "?")))
            return kwt_usage_error("dump", "unknown record kind '%s'", t);
        if (k >= KW_KIND_SNAP_TABLES)
            return kwt_usage_error("dump", "'%s' records live in the snap database, not in the WAL", t);
        *mask |= 1u << k;
    }
    return *mask ? KWT_EXIT_OK : kwt_usage_error("dump", "--kind needs a kind");
}

static int parse_args(int argc, char **argv, void *opts)
{
    dump_opts *o = opts;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int rc;
        if ((rc = kwt_opt_u64("dump", argc, argv, &i, "--from-lsn", &o->from_lsn)) ||
            (rc = kwt_opt_u64("dump", argc, argv, &i, "--from-tick", &o->from_tick))) {
            if (rc < 0)
                return KWT_EXIT_USAGE;
        } else if ((rc = kwt_opt_u64("dump", argc, argv, &i, "--to-lsn", &o->to_lsn))) {
            if (rc < 0)
                return KWT_EXIT_USAGE;
            o->has_to_lsn = true;
        } else if ((rc = kwt_opt_u64("dump", argc, argv, &i, "--to-tick", &o->to_tick))) {
            if (rc < 0)
                return KWT_EXIT_USAGE;
            o->has_to_tick = true;
        } else if ((rc = kwt_opt("dump", argc, argv, &i, "--kind", &v))) {
            if (rc < 0 || parse_kinds(v, &o->kinds))
                return KWT_EXIT_USAGE;
        } else if ((rc = kwt_opt("dump", argc, argv, &i, "--component", &v))) {
            if (rc < 0)
                return KWT_EXIT_USAGE;
            o->component_name = v;
        } else if ((rc = kwt_opt("dump", argc, argv, &i, "--entity", &v))) {
            if (rc < 0)
                return KWT_EXIT_USAGE;
            if (!kwt_parse_entity(v, &o->entity))
                return kwt_usage_error("dump", "'%s' is not an entity handle (16 hex digits, 0x<hex> or INDEX:GEN)", v);
            o->has_entity = true;
        } else if (!strcmp(argv[i], "--json")) {
            o->json = true;
        } else if (kwt_arg_dir("dump", argv[i], &o->dir)) {
            return KWT_EXIT_USAGE;
        }
    }
    return kwt_need_dir("dump", o->dir);
}

/* The component filter names a component of the stored schema, by name or id. */
static int resolve_component(const kwt_dir *d, dump_opts *o)
{
    uint64_t id;
    if (!o->component_name)
        return KWT_EXIT_OK;
    o->component = kwt_comp_find(d, o->component_name);
    if (!o->component && kwt_parse_u64(o->component_name, &id) && id >= 1 && id <= 255)
        o->component = (uint32_t)id;
    if (o->component)
        return KWT_EXIT_OK;
    if (!d->has_schema)
        kwt_err(d->path, "--component %s: the directory has no readable schema%s%s", o->component_name,
                d->schema_error[0] ? ": " : "", d->schema_error);
    else
        kwt_err(d->path, "--component %s: no such component in the stored schema (keel-wal info lists them)",
                o->component_name);
    return KWT_EXIT_USAGE;
}

/* ---- matching ---------------------------------------------------------------------- */

static bool change_has_comp(const kw_change *c, uint32_t comp)
{
    if (c->op == KW_OP_SPAWN) {
        for (uint32_t i = 0; i < c->n; i++)
            if (c->comps[i] == comp)
                return true;
        return false;
    }
    return c->op != KW_OP_DESTROY && c->component == comp;
}

static bool change_matches(const dump_opts *o, const kw_change *c)
{
    if (o->has_entity && c->entity != o->entity)
        return false;
    return !o->component || change_has_comp(c, o->component);
}

static bool filters_changes(const dump_opts *o)
{
    return o->has_entity || o->component;
}


/* A record's changes as one or more decodable headers and payloads: the
 * record itself, or each transaction of a SIDES record (fn gets its index). */
typedef int (*part_fn)(const kwt_dir *d, const dump_opts *o, const kw_header *h, const void *payload, kw_decoder *dec,
                       uint32_t index, void *arg);

typedef struct part_call {
    const kwt_dir *d;
    const dump_opts *o;
    kw_decoder *dec;
    part_fn fn;
    void *arg;
    uint32_t index;
} part_call;

static int call_part(void *arg, const kw_header *h, const void *payload)
{
    part_call *c = arg;
    return c->fn(c->d, c->o, h, payload, c->dec, c->index++, c->arg);
}

static int each_part(const kwt_dir *d, const dump_opts *o, const kw_record *r, const void *payload, kw_decoder *dec,
                     part_fn fn, void *arg)
{
    part_call c = {d, o, dec, fn, arg, 0};
    return kw_each_part(&r->h, payload, call_part, &c);
}

/* What one pass over a record's changes found. */
typedef struct summary {
    uint64_t total, matched;
    uint32_t parts;           /* SIDES: transactions */
    uint64_t ops[5];
    uint32_t rows_per_comp[256];
} summary;

static int summarize_part(const kwt_dir *d, const dump_opts *o, const kw_header *h, const void *payload,
                          kw_decoder *dec, uint32_t index, void *arg)
{
    (void)index;
    summary *sm = arg;
    sm->parts++;
    kw_change c;
    int rc = kw_decode_record(dec, h, payload, d->has_schema ? &d->schema : NULL);
    if (rc)
        return rc;
    while ((rc = kw_decode_next(dec, &c)) == 1) {
        sm->total++;
        if (!change_matches(o, &c))
            continue;
        sm->matched++;
        sm->ops[c.op < 5 ? c.op : 0]++;
        if (c.op == KW_OP_SET)
            sm->rows_per_comp[c.component & 255]++;
    }
    return rc;
}

static int summarize(const kwt_dir *d, const dump_opts *o, const kw_record *r, const void *payload, summary *sm,
                     kw_decoder *dec)
{
    return each_part(d, o, r, payload, dec, summarize_part, sm);
}

/* ---- printing ---------------------------------------------------------------------- */

static int json_part(const kwt_dir *d, const dump_opts *o, const kw_header *h, const void *payload, kw_decoder *dec,
                     uint32_t index, void *arg)
{
    kw_change c;
    bool first = true, in_sides = *(const bool *)arg;
    kw_decode_record(dec, h, payload, d->has_schema ? &d->schema : NULL);
    if (in_sides)
        printf("%s{\"index\":%u", index ? "," : "", index);
    if (h->kind == KW_KIND_SIDE)
        printf(",\"seq\":%" PRIu64 ",\"mode\":\"%s\"", dec->side_seq, mode_name(dec->side_mode));
    if (h->kind == KW_KIND_SIDE && dec->side_key)
        printf(",\"key\":%" PRIu64, dec->side_key);
    printf(",\"changes\":[");
    while (kw_decode_next(dec, &c) == 1) {
        if (!change_matches(o, &c))
            continue;
        if (!first)
            putchar(',');
        kwt_json_change(stdout, d, &c);
        first = false;
    }
    fputs(in_sides ? "]}" : "]", stdout);
    return KEEL_OK;
}

/* ,"changes":[...]; a SIDES record's: ,"transactions":[{"index", "seq", "mode", "key", "changes"}, ...] */
static void json_changes(const kwt_dir *d, const dump_opts *o, const kw_record *r, const void *payload,
                         kw_decoder *dec)
{
    bool sides = r->h.kind == KW_KIND_SIDES;
    if (sides)
        printf(",\"transactions\":[");
    each_part(d, o, r, payload, dec, json_part, &sides);
    if (sides)
        putchar(']');
}

static int text_part(const kwt_dir *d, const dump_opts *o, const kw_header *h, const void *payload, kw_decoder *dec,
                     uint32_t index, void *arg)
{
    (void)index;
    (void)arg;
    kw_change c;
    const char *sep = " |";
    char eb[17], nb[16];
    kw_decode_record(dec, h, payload, d->has_schema ? &d->schema : NULL);
    while (kw_decode_next(dec, &c) == 1) {
        if (!change_matches(o, &c))
            continue;
        printf("%s %s %s", sep, op_names[c.op < 5 ? c.op : 0], kwt_format_entity(c.entity, eb));
        sep = ";";
        if (c.op == KW_OP_SPAWN) {
            for (uint32_t i = 0; i < c.n; i++) {
                printf(" %s=", kwt_comp_name(d, c.comps[i], nb));
                kwt_json_value(stdout, d, c.comps[i], c.values[i], c.sizes[i]);
            }
        } else if (c.op != KW_OP_DESTROY) {
            printf(" %s", kwt_comp_name(d, c.component, nb));
            if (c.op != KW_OP_REMOVE) {
                putchar('=');
                kwt_json_value(stdout, d, c.component, c.value, c.size);
            }
        }
    }
    return KEEL_OK;
}

static void text_changes(const kwt_dir *d, const dump_opts *o, const kw_record *r, const void *payload,
                         kw_decoder *dec)
{
    each_part(d, o, r, payload, dec, text_part, NULL);
}

/* A SIDES record's transactions: " | seq=S mode=M writes=W[ key=K]" each
 * (with --entity or --component, those with a matching write). */
static int text_side_part(const kwt_dir *d, const dump_opts *o, const kw_header *h, const void *payload,
                          kw_decoder *dec, uint32_t index, void *arg)
{
    (void)index;
    (void)arg;
    kw_change c;
    uint64_t writes = 0;
    kw_decode_record(dec, h, payload, d->has_schema ? &d->schema : NULL);
    while (kw_decode_next(dec, &c) == 1)
        writes += change_matches(o, &c);
    if (filters_changes(o) && !writes) /* filtered: the transactions with a match only */
        return KEEL_OK;
    printf(" | seq=%" PRIu64 " mode=%s writes=%" PRIu64, dec->side_seq, mode_name(dec->side_mode), writes);
    if (dec->side_key)
        printf(" key=%" PRIu64, dec->side_key);
    return KEEL_OK;
}

static void text_summary(const kwt_dir *d, const dump_opts *o, const kw_record *r, const void *payload,
                         const summary *sm, kw_decoder *dec)
{
    char nb[16];
    switch (r->h.kind) {
    case KW_KIND_TICK_CHUNK:
        printf(" rows=%" PRIu64, sm->matched);
        for (uint32_t k = 1; k < 256; k++)
            if (sm->rows_per_comp[k])
                printf(" %s=%u", kwt_comp_name(d, k, nb), sm->rows_per_comp[k]);
        break;
    case KW_KIND_LIFECYCLE:
        printf(" ops=%" PRIu64 " spawn=%" PRIu64 " destroy=%" PRIu64 " add=%" PRIu64 " remove=%" PRIu64, sm->matched,
               sm->ops[KW_OP_SPAWN], sm->ops[KW_OP_DESTROY], sm->ops[KW_OP_ADD], sm->ops[KW_OP_REMOVE]);
        break;
    case KW_KIND_SIDE:
        printf(" seq=%" PRIu64 " mode=%s writes=%" PRIu64, dec->side_seq, mode_name(dec->side_mode), sm->matched);
        if (dec->side_key)
            printf(" key=%" PRIu64, dec->side_key);
        break;
    case KW_KIND_SIDES:
        printf(" transactions=%u writes=%" PRIu64, sm->parts, sm->matched);
        each_part(d, o, r, payload, dec, text_side_part, NULL);
        break;
    default:
        break;
    }
}

/* TICK_COMMIT, CHECKPOINT, EPOCH and SCHEMA: small fixed payloads, decoded here. */
static void other_fields(const kw_record *r, const void *payload, bool json)
{
    kw_cursor cur = kw_cursor_make(payload, r->h.raw_len);
    if (r->h.kind == KW_KIND_TICK_COMMIT) {
        kw_commit_info ci;
        kw_decode_commit(payload, r->h.raw_len, &ci);
        printf(json ? ",\"nrecords\":%u,\"nlive\":%u,\"nslots\":%u" : " nrecords=%u nlive=%u nslots=%u", ci.nrecords,
               ci.nlive, ci.nslots);
    } else if (r->h.kind == KW_KIND_CHECKPOINT) {
        uint64_t covered = kw_get_u64(&cur), tick = kw_get_u64(&cur);
        printf(json ? ",\"covered_lsn\":%" PRIu64 ",\"checkpoint_tick\":%" PRIu64
                    : " covered_lsn=%" PRIu64 " checkpoint_tick=%" PRIu64, covered, tick);
    } else if (r->h.kind == KW_KIND_EPOCH) {
        kw_epoch e;
        if (!kw_epoch_decode(payload, r->h.raw_len, &e))
            printf(json ? ",\"epoch\":%" PRIu64 ",\"node\":\"%s\"" : " epoch=%" PRIu64 " node=%s", e.epoch, e.node);
    } else if (r->h.kind == KW_KIND_SCHEMA) {
        kw_schema s;
        if (kw_schema_decode(payload, r->h.raw_len, &s))
            return;
        if (json) {
            printf(",\"components\":");
            kwt_json_schema(stdout, &s);
        } else {
            printf(" components=%u", s.ncomps);
        }
        kw_schema_free(&s);
    }
}

/* Checks the small payloads without printing (so a bad one prints nothing):
 * NULL when fine, else why. */
static const char *check_other(const kw_record *r, const void *payload)
{
    kw_commit_info ci;
    kw_schema s;
    kw_epoch e;
    if (r->h.kind == KW_KIND_EPOCH && kw_epoch_decode(payload, r->h.raw_len, &e))
        return keel_last_error();
    if (r->h.kind == KW_KIND_TICK_COMMIT && kw_decode_commit(payload, r->h.raw_len, &ci))
        return keel_last_error();
    if (r->h.kind == KW_KIND_CHECKPOINT && r->h.raw_len != 16)
        return "a checkpoint marker's payload is not 16 bytes";
    if (r->h.kind == KW_KIND_SCHEMA) {
        if (kw_schema_decode(payload, r->h.raw_len, &s))
            return keel_last_error();
        kw_schema_free(&s);
    }
    return NULL;
}

static void print_header(const kw_record *r, bool json)
{
    const kw_header *h = &r->h;
    const char *codec = kw_codec_name(h->codec);
    if (json)
        printf("{\"lsn\":%" PRIu64 ",\"tick\":%" PRIu64 ",\"kind\":\"%s\",\"flags\":%u,\"hook\":%s,\"codec\":\"%s\","
               "\"raw_len\":%u,\"stored_len\":%u", r->lsn, h->tick, kw_kind_name(h->kind), h->flags,
               h->flags & KW_FLAG_HOOK ? "true" : "false", codec, h->raw_len, h->stored_len);
    else
        printf("lsn=%" PRIu64 " tick=%" PRIu64 " kind=%s flags=%u codec=%s raw=%u stored=%u", r->lsn, h->tick,
               kw_kind_name(h->kind), h->flags, codec, h->raw_len, h->stored_len);
}

/* 0 printed or filtered out, KWT_EXIT_PROBLEM when the record is invalid (reported). */
static int dump_record(kwt_dir *d, const dump_opts *o, const kw_record *r, kw_decoder *dec, summary *sm)
{
    const void *payload;
    const char *why = NULL;
    if (filters_changes(o) && !kw_kind_has_changes(r->h.kind))
        return KWT_EXIT_OK;
    memset(sm, 0, sizeof *sm);
    if (kwt_payload(d, r, &payload) || (kw_kind_has_changes(r->h.kind) && summarize(d, o, r, payload, sm, dec)))
        why = keel_last_error();
    else if (!kw_kind_has_changes(r->h.kind))
        why = check_other(r, payload);
    if (why) {
        kwt_err(d->path, "LSN %" PRIu64 ": %s (skipped)", r->lsn, why);
        return KWT_EXIT_PROBLEM;
    }
    if (filters_changes(o) && !sm->matched)
        return KWT_EXIT_OK;
    print_header(r, o->json);
    if (kw_kind_has_changes(r->h.kind)) {
        if (o->json) {
            json_changes(d, o, r, payload, dec);
        } else {
            text_summary(d, o, r, payload, sm, dec);
            if (filters_changes(o))
                text_changes(d, o, r, payload, dec);
        }
    } else {
        other_fields(r, payload, o->json);
    }
    fputs(o->json ? "}\n" : "\n", stdout);
    return KWT_EXIT_OK;
}

static bool in_range(const dump_opts *o, const kw_record *r)
{
    if (o->has_to_lsn && r->lsn > o->to_lsn)
        return false;
    if (r->h.tick < o->from_tick || (o->has_to_tick && r->h.tick > o->to_tick))
        return false;
    return !o->kinds || (r->h.kind < 32 && (o->kinds >> r->h.kind & 1));
}

static int dump(kwt_dir *d, const dump_opts *o)
{
    kw_rtxn *r;
    int rc = kwt_read_begin(d, &r);
    if (rc)
        return rc;
    kw_scan *s;
    kw_range range = {.from_lsn = o->from_lsn};
    if (kw_scan_begin(r, &range, &s)) {
        kwt_err(d->path, "%s", keel_last_error());
        kw_read_end(r);
        return KWT_EXIT_USAGE;
    }
    static kw_decoder dec; /* 3 KiB of scratch: not on the stack */
    static summary sm;
    kw_record rec;
    int result = KWT_EXIT_OK;
    while (!kwt_output_broken() && (rc = kwt_scan_next(s, &rec)) > 0) {
        if (o->has_to_lsn && rec.lsn > o->to_lsn)
            break;
        if (rc == KWT_SCAN_INVALID) {
            kwt_err(d->path, "LSN %" PRIu64 ": %s (skipped)", rec.lsn, keel_last_error());
            result = KWT_EXIT_PROBLEM;
        } else if (in_range(o, &rec) && dump_record(d, o, &rec, &dec, &sm)) {
            result = KWT_EXIT_PROBLEM;
        }
    }
    if (rc < 0) {
        kwt_err(d->path, "%s", keel_last_error());
        result = KWT_EXIT_PROBLEM;
    }
    kw_scan_end(s);
    kw_read_end(r);
    return result;
}

int kwt_print_record(kwt_dir *d, const kw_record *r, bool json)
{
    static kw_decoder dec;
    static summary sm;
    dump_opts o = {.json = json};
    return dump_record(d, &o, r, &dec, &sm);
}

static int run(kwt_dir *d, void *opts)
{
    int rc = resolve_component(d, opts);
    return rc ? rc : dump(d, opts);
}

int kwt_cmd_dump(int argc, char **argv)
{
    dump_opts o = {0};
    return kwt_run_on_dir(argc, argv, dump_help, parse_args, &o, &o.dir, run);
}
