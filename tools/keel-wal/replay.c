/*
 * tools/keel-wal/replay.c -- `keel-wal replay DIR --to-tick N`: rebuild the
 * world state at the end of tick N from the checkpoint and the WAL
 * (state.c) and print its hash -- the value keel_world_hash() had in the
 * runtime at that tick -- or one entity's components as JSON.
 */
#include <inttypes.h>
#include <string.h>

#include "state.h"

static const char replay_help[] =
    "usage: keel-wal replay DIR --to-tick N [--entity HANDLE] [--json] [--no-checkpoint]\n"
    "\n"
    "Rebuild the world state at the end of tick N, offline, and print\n"
    "    tick=<N> hash=<16 hex digits>\n"
    "where the hash is the one keel_world_hash() returned in the runtime at tick N.\n"
    "The replay loads the checkpoint when its tick is <= N, else starts from the\n"
    "empty world at LSN 1, then applies the WAL in LSN order as recovery does\n"
    "(whole tick units, on_first_tick's units, side transactions where they stand)\n"
    "up to the first record of a later tick.\n"
    "\n"
    "Ticks before the checkpoint are reachable only when the runtime kept the WAL\n"
    "records the checkpoint covers (the runtime option wal_retain, keel-world\n"
    "--wal-retain); otherwise replay says so and exits 1.\n"
    "\n"
    "  --to-tick N        the tick (0 = the state before the first tick)\n"
    "  --entity HANDLE    print this entity at tick N as one JSON object instead:\n"
    "                     {\"tick\":N,\"entity\":\"..\",\"live\":true,\"generation\":G,\n"
    "                      \"components\":{\"name\":{\"field\":value,...},...},\n"
    "                      \"transient\":[\"name\",...]}\n"
    "                     (TRANSIENT components are listed by name: their values are\n"
    "                     not durable). HANDLE: 16 hex digits, 0x<hex> or INDEX:GEN.\n"
    "                     An entity not live at tick N prints \"live\":false, exit 1.\n"
    "  --json             the hash line as a JSON object, with the entity and slot\n"
    "                     counts and where the replay started\n"
    "  --no-checkpoint    ignore the checkpoint and replay the WAL from LSN 1 (needs\n"
    "                     wal_retain; an audit of the checkpoint against the WAL)\n"
    "\n"
    "A long replay shows its progress on a terminal (stderr), never in a pipe.\n"
    "Exit status: 0; 1 tick N cannot be rebuilt (before the checkpoint without\n"
    "wal_retain, beyond the last completed tick, a corrupt record: KEEL_ECORRUPT\n"
    "naming its LSN) or the entity is not live; 2 bad arguments or the directory\n"
    "cannot be opened.\n";

typedef struct replay_args {
    kws_args c;
    uint64_t tick;
    bool has_tick, has_entity;
    uint64_t entity;
} replay_args;

static int parse(int argc, char **argv, void *opts)
{
    replay_args *a = opts;
    const char *cmd = "replay", *v;
    for (int i = 1; i < argc; i++) {
        int rc;
        if ((rc = kwt_opt_u64(cmd, argc, argv, &i, "--to-tick", &a->tick))) {
            if (rc < 0)
                return KWT_EXIT_USAGE;
            a->has_tick = true;
        } else if ((rc = kwt_opt(cmd, argc, argv, &i, "--entity", &v))) {
            if (rc < 0)
                return KWT_EXIT_USAGE;
            if (!kwt_parse_entity(v, &a->entity) || !a->entity)
                return kwt_usage_error(cmd, "--entity wants a handle (16 hex digits, 0x<hex> or INDEX:GEN), not '%s'",
                                       v);
            a->has_entity = true;
        } else if (kws_arg(cmd, argv[i], &a->c)) {
            return KWT_EXIT_USAGE;
        }
    }
    if (kws_need_dir(cmd, &a->c))
        return KWT_EXIT_USAGE;
    if (!a->has_tick)
        return kwt_usage_error(cmd, "--to-tick N is required");
    return KWT_EXIT_OK;
}

/* The entity as one JSON object; exit 1 when it is not live. */
static int print_entity(const kwt_dir *d, const kws_state *s, uint64_t tick, uint64_t e)
{
    const kws_ent *ent = kws_state_get(s, e);
    uint32_t idx = KWT_ENTITY_INDEX(e);
    printf("{\"tick\":%" PRIu64 ",\"entity\":", tick);
    kwt_json_entity(stdout, e);
    if (!ent) {
        printf(",\"live\":false}\n");
        char buf[17];
        if (idx >= s->nslots)
            kwt_err(d->path, "entity %s is not live at tick %" PRIu64 ": slot %u was never used (%u slots)",
                    kwt_format_entity(e, buf), tick, idx, s->nslots);
        else if (s->ent[idx])
            kwt_err(d->path, "entity %s is not live at tick %" PRIu64 ": slot %u holds generation %u",
                    kwt_format_entity(e, buf), tick, idx, s->gen[idx]);
        else
            kwt_err(d->path, "entity %s is not live at tick %" PRIu64 ": slot %u is free (its next generation is %u)",
                    kwt_format_entity(e, buf), tick, idx, s->gen[idx]);
        return KWT_EXIT_PROBLEM;
    }
    printf(",\"live\":true,\"generation\":%u,\"components\":{", KWT_ENTITY_GEN(e));
    bool first = true;
    char nb[16];
    for (uint32_t k = 0; k < ent->n; k++) {
        uint32_t id = kws_ent_id(ent, k);
        if (s->transient[id])
            continue;
        if (!first)
            putchar(',');
        first = false;
        kwt_json_string(stdout, kwt_comp_name(d, id, nb));
        putchar(':');
        kwt_json_value(stdout, d, id, kws_ent_value(s, ent, id), s->size[id]);
    }
    printf("},\"transient\":[");
    first = true;
    for (uint32_t k = 0; k < ent->n; k++) {
        uint32_t id = kws_ent_id(ent, k);
        if (!s->transient[id])
            continue;
        if (!first)
            putchar(',');
        first = false;
        kwt_json_string(stdout, kwt_comp_name(d, id, nb));
    }
    printf("]}\n");
    return KWT_EXIT_OK;
}

static void print_hash(const kws_state *s, const kws_info *in, uint64_t tick, bool json)
{
    uint64_t h = kws_state_hash(s);
    if (!json) {
        printf("tick=%" PRIu64 " hash=%016" PRIx64 "\n", tick, h);
        return;
    }
    printf("{\"tick\":%" PRIu64 ",\"hash\":\"%016" PRIx64 "\",\"entities\":%u,\"slots\":%u,"
           "\"from_checkpoint\":%s,\"checkpoint_tick\":%" PRIu64 ",\"start_lsn\":%" PRIu64 ",\"lsn\":%" PRIu64
           ",\"records\":%" PRIu64 "}\n",
           tick, h, s->nlive, s->nslots, in->from_checkpoint ? "true" : "false", in->checkpoint_tick, in->start_lsn,
           in->lsn, in->records);
}

static int run(kwt_dir *d, void *opts)
{
    const replay_args *a = opts;
    kws_replay *rp;
    int rc = kws_replay_open(d, a->tick, a->c.no_checkpoint, &rp);
    if (rc)
        return rc;
    if (!(rc = kws_replay_to(rp, a->tick))) {
        if (a->has_entity)
            rc = print_entity(d, kws_replay_state(rp), a->tick, a->entity);
        else
            print_hash(kws_replay_state(rp), kws_replay_info(rp), a->tick, a->c.json);
    }
    kws_replay_close(rp);
    return rc;
}

int kwt_cmd_replay(int argc, char **argv)
{
    replay_args a = {0};
    return kwt_run_on_dir(argc, argv, replay_help, parse, &a, &a.c.dir, run);
}
