/*
 * tools/keel-wal/diff.c -- `keel-wal diff DIR --from-tick A --to-tick B`:
 * the entities created, destroyed and changed between the end of tick A
 * and the end of tick B, with field-level old -> new values.
 *
 * One replay pass: rebuild the state at A (state.c), keep a copy, carry on
 * to B, compare the two slot by slot. Only durable state is compared, as
 * the state hash sees it: TRANSIENT components are left out.
 */
#include <inttypes.h>
#include <string.h>

#include "state.h"

static const char diff_help[] =
    "usage: keel-wal diff DIR --from-tick A --to-tick B [--json] [--no-checkpoint]\n"
    "       (also: keel-wal diff DIR --tick A --tick B)\n"
    "\n"
    "Compare the durable world state at the end of tick A with the one at the end\n"
    "of tick B (A <= B; both rebuilt as 'keel-wal replay' does). Text output, one\n"
    "fact per line, entities in slot order:\n"
    "    diff tick A -> B: <n> created, <n> destroyed, <n> changed\n"
    "    created   <entity> name={..} name={..}      (its components at B)\n"
    "    destroyed <entity> name={..}                (its components at A)\n"
    "    changed   <entity> name.field: <old> -> <new>\n"
    "    changed   <entity> name: added {..}\n"
    "    changed   <entity> name: removed (was {..})\n"
    "A slot reused between A and B shows the old handle destroyed and the new one\n"
    "created. Values print as JSON, decoded by the stored schema; TRANSIENT\n"
    "components are not compared (they are not durable).\n"
    "\n"
    "  --from-tick A, --to-tick B   the two ticks (or --tick A --tick B)\n"
    "  --json          JSON lines instead: first {\"op\":\"summary\",\"from_tick\":A,\n"
    "                  \"to_tick\":B,\"created\":n,\"destroyed\":n,\"changed\":n}, then\n"
    "                  {\"op\":\"created\"|\"destroyed\",\"entity\":\"..\",\"components\":{..}},\n"
    "                  {\"op\":\"changed\",\"entity\":\"..\",\"component\":\"name\",\"field\":\"f\",\n"
    "                   \"old\":v,\"new\":v}, {\"op\":\"added\",..,\"value\":{..}},\n"
    "                  {\"op\":\"removed\",..,\"old\":{..}}\n"
    "  --no-checkpoint replay the WAL from LSN 1, ignoring the checkpoint\n"
    "\n"
    "Ticks before the checkpoint need the WAL records it covers (wal_retain).\n"
    "Exit status: 0; 1 a tick cannot be rebuilt (see 'keel-wal replay --help');\n"
    "2 bad arguments or the directory cannot be opened.\n";

typedef struct diff_args {
    kws_args c;
    uint64_t from, to;
    bool has_from, has_to;
} diff_args;

typedef struct differ {
    const kwt_dir *d;
    const kws_state *a, *b;
    bool json;
    uint64_t created, destroyed, changed;
} differ;

static int parse(int argc, char **argv, void *opts)
{
    diff_args *a = opts;
    const char *cmd = "diff";
    for (int i = 1; i < argc; i++) {
        int rc;
        uint64_t t;
        if ((rc = kwt_opt_u64(cmd, argc, argv, &i, "--from-tick", &a->from))) {
            a->has_from = true;
        } else if ((rc = kwt_opt_u64(cmd, argc, argv, &i, "--to-tick", &a->to))) {
            a->has_to = true;
        } else if ((rc = kwt_opt_u64(cmd, argc, argv, &i, "--tick", &t))) {
            if (rc > 0 && a->has_from && a->has_to)
                return kwt_usage_error(cmd, "--tick is given more than twice");
            if (rc > 0 && !a->has_from)
                a->from = t, a->has_from = true;
            else if (rc > 0)
                a->to = t, a->has_to = true;
        } else if (kws_arg(cmd, argv[i], &a->c)) {
            return KWT_EXIT_USAGE;
        }
        if (rc < 0)
            return KWT_EXIT_USAGE;
    }
    if (kws_need_dir(cmd, &a->c))
        return KWT_EXIT_USAGE;
    if (!a->has_from || !a->has_to)
        return kwt_usage_error(cmd, "both --from-tick A and --to-tick B are required");
    if (a->from > a->to)
        return kwt_usage_error(cmd, "--from-tick %" PRIu64 " is after --to-tick %" PRIu64, a->from, a->to);
    return KWT_EXIT_OK;
}

/* ---- output ------------------------------------------------------------------------- */

static const char *name_of(const differ *df, uint32_t id, char buf[16])
{
    return kwt_comp_name(df->d, id, buf);
}

static const kw_component *schema_of(const differ *df, uint32_t id)
{
    return kw_schema_get(&df->d->schema, id);
}

/* "created"/"destroyed": the entity's durable components. */
static void print_entity(const differ *df, const char *op, uint64_t e, const kws_state *s, const kws_ent *ent)
{
    char eb[17], nb[16];
    if (df->json) {
        printf("{\"op\":\"%s\",\"entity\":", op);
        kwt_json_entity(stdout, e);
        printf(",\"components\":{");
    } else {
        printf("%-9s %s", op, kwt_format_entity(e, eb));
    }
    bool first = true;
    for (uint32_t k = 0; k < ent->n; k++) {
        uint32_t id = kws_ent_id(ent, k);
        if (s->transient[id])
            continue;
        if (df->json) {
            if (!first)
                putchar(',');
            kwt_json_string(stdout, name_of(df, id, nb));
            putchar(':');
        } else {
            printf(" %s=", name_of(df, id, nb));
        }
        first = false;
        kwt_json_value(stdout, df->d, id, kws_ent_value(s, ent, id), s->size[id]);
    }
    fputs(df->json ? "}}\n" : "\n", stdout);
}

static void change_head(const differ *df, const char *op, uint64_t e, uint32_t id)
{
    char eb[17], nb[16];
    if (df->json) {
        printf("{\"op\":\"%s\",\"entity\":", op);
        kwt_json_entity(stdout, e);
        printf(",\"component\":");
        kwt_json_string(stdout, name_of(df, id, nb));
    } else {
        printf("changed   %s %s", kwt_format_entity(e, eb), name_of(df, id, nb));
    }
}

/* A component present at both ticks: one line per field that differs
 * (or one for the whole value when only bytes outside every field do). */
static void print_value_change(const differ *df, uint64_t e, uint32_t id, const unsigned char *va,
                               const unsigned char *vb)
{
    const kw_component *c = schema_of(df, id);
    uint32_t size = df->a->size[id];
    bool any = false;
    for (uint32_t f = 0; c && f < c->nfields; f++) {
        const kw_field *fl = &c->fields[f];
        uint64_t w = (uint64_t)kwt_type_size(fl->type) * (fl->count ? fl->count : 1);
        if (fl->offset > size || w > size - fl->offset || !memcmp(va + fl->offset, vb + fl->offset, w))
            continue;
        any = true;
        change_head(df, "changed", e, id);
        if (df->json) {
            printf(",\"field\":");
            kwt_json_string(stdout, fl->name);
            printf(",\"old\":");
            kwt_json_field(stdout, fl, va, size);
            printf(",\"new\":");
            kwt_json_field(stdout, fl, vb, size);
            printf("}\n");
        } else {
            printf(".%s: ", fl->name);
            kwt_json_field(stdout, fl, va, size);
            printf(" -> ");
            kwt_json_field(stdout, fl, vb, size);
            putchar('\n');
        }
    }
    if (any)
        return;
    change_head(df, "changed", e, id);
    fputs(df->json ? ",\"old\":" : ": ", stdout);
    kwt_json_value(stdout, df->d, id, va, size);
    fputs(df->json ? ",\"new\":" : " -> ", stdout);
    kwt_json_value(stdout, df->d, id, vb, size);
    fputs(df->json ? "}\n" : "\n", stdout);
}

static void print_added(const differ *df, uint64_t e, uint32_t id, const unsigned char *v)
{
    change_head(df, df->json ? "added" : "changed", e, id);
    fputs(df->json ? ",\"value\":" : ": added ", stdout);
    kwt_json_value(stdout, df->d, id, v, df->b->size[id]);
    fputs(df->json ? "}\n" : "\n", stdout);
}

static void print_removed(const differ *df, uint64_t e, uint32_t id, const unsigned char *v)
{
    change_head(df, df->json ? "removed" : "changed", e, id);
    fputs(df->json ? ",\"old\":" : ": removed (was ", stdout);
    kwt_json_value(stdout, df->d, id, v, df->a->size[id]);
    fputs(df->json ? "}\n" : ")\n", stdout);
}

/* ---- comparing -------------------------------------------------------------------- */

/* Does the entity's durable content differ? With print, say how. Both
 * component lists are in id order: merge them. */
static bool compare_entity(const differ *df, uint64_t e, const kws_ent *ea, const kws_ent *eb, bool print)
{
    const kws_state *a = df->a, *b = df->b;
    uint32_t i = 0, j = 0;
    bool differs = false;
    while (i < ea->n || j < eb->n) {
        uint32_t ia = i < ea->n ? kws_ent_id(ea, i) : 256, ib = j < eb->n ? kws_ent_id(eb, j) : 256;
        uint32_t id = ia < ib ? ia : ib;
        i += ia == id;
        j += ib == id;
        if (a->transient[id])
            continue;
        const unsigned char *va = ia == id ? kws_ent_value(a, ea, id) : NULL;
        const unsigned char *vb = ib == id ? kws_ent_value(b, eb, id) : NULL;
        if (va && vb && !memcmp(va, vb, a->size[id]))
            continue;
        differs = true;
        if (!print)
            return true;
        if (va && vb)
            print_value_change(df, e, id, va, vb);
        else if (vb)
            print_added(df, e, id, vb);
        else
            print_removed(df, e, id, va);
    }
    return differs;
}

/* One pass over the slots: count (print false) or print. */
static void walk(differ *df, bool print)
{
    const kws_state *a = df->a, *b = df->b;
    for (uint32_t i = 0; i < b->nslots && !kwt_output_broken(); i++) {
        const kws_ent *ea = i < a->nslots ? a->ent[i] : NULL, *eb = b->ent[i];
        uint64_t ha = ea ? (uint64_t)a->gen[i] << 32 | i : 0, hb = eb ? (uint64_t)b->gen[i] << 32 | i : 0;
        if (ea && ha == hb) {
            if (compare_entity(df, ha, ea, eb, print))
                df->changed += !print;
            continue;
        }
        if (ea) {
            df->destroyed += !print;
            if (print)
                print_entity(df, "destroyed", ha, a, ea);
        }
        if (eb) {
            df->created += !print;
            if (print)
                print_entity(df, "created", hb, b, eb);
        }
    }
}

static void print_diff(differ *df, uint64_t from, uint64_t to)
{
    walk(df, false);
    if (df->json)
        printf("{\"op\":\"summary\",\"from_tick\":%" PRIu64 ",\"to_tick\":%" PRIu64 ",\"created\":%" PRIu64
               ",\"destroyed\":%" PRIu64 ",\"changed\":%" PRIu64 "}\n",
               from, to, df->created, df->destroyed, df->changed);
    else
        printf("diff tick %" PRIu64 " -> %" PRIu64 ": %" PRIu64 " created, %" PRIu64 " destroyed, %" PRIu64
               " changed\n", from, to, df->created, df->destroyed, df->changed);
    walk(df, true);
}

static int run(kwt_dir *d, void *opts)
{
    const diff_args *a = opts;
    kws_replay *rp;
    int rc = kws_replay_open(d, a->from, a->c.no_checkpoint, &rp);
    if (rc)
        return rc;
    kws_state at_a;
    if (!(rc = kws_replay_to(rp, a->from))) {
        if (kws_state_clone(&at_a, kws_replay_state(rp))) {
            kwt_err(d->path, "KEEL_ENOMEM: out of memory copying the state of tick %" PRIu64, a->from);
            rc = KWT_EXIT_USAGE;
        } else {
            if (!(rc = kws_replay_to(rp, a->to))) {
                differ df = {.d = d, .a = &at_a, .b = kws_replay_state(rp), .json = a->c.json};
                print_diff(&df, a->from, a->to);
            }
            kws_state_free(&at_a);
        }
    }
    kws_replay_close(rp);
    return rc;
}

int kwt_cmd_diff(int argc, char **argv)
{
    diff_args a = {0};
    return kwt_run_on_dir(argc, argv, diff_help, parse, &a, &a.c.dir, run);
}
