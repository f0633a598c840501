/*
 * keel-bench -- keel's benchmarks (docs/performance.md), each measured side
 * by side with its baseline in the same process run.
 *
 *   keel-bench [all|NAME...] [--json] [--rounds N] [--entities N]
 *
 * Method. The machines are noisy, so a figure is never compared with a number
 * from another run: after one untimed warm-up of each side, every round
 * measures the baseline and the subject alternately (baseline first in even
 * rounds, subject first in odd rounds), and the figure reports the MEDIAN
 * over the rounds of each side (CLOCK_MONOTONIC). ratio = value / baseline.
 * Freed memory stays resident in the heap between rounds (see
 * keep_heap_resident). Text mode prints one line per figure (value,
 * baseline, ratio, target, ok / MISS) and a summary table at the end;
 * --json prints one object per line per figure:
 *   {"name", "value", "unit", "baseline", "ratio", "target", "target_of",
 *    "bound", "meets"}   (target / meets null for a figure without one)
 * Targets are reported, not enforced: the exit status is 0 whatever the
 * figures, 2 for bad arguments and 1 only when the library itself fails.
 *
 * Benchmarks (NAME) and their figures; a group runs several. The targets
 * are in the figures' definitions and docs/performance.md ("Targets").
 *  iterate    = iterate + parallel; spawn = spawn + destroy; wal includes
 *             fence; repl includes bootstrap and lag.
 *
 * In-memory figures (bench_memory.c), against plain C:
 *  memory     peak RSS of a forked child that spawns N entities with pos+vel
 *             and runs ticks rewriting both, minus its RSS before, vs the raw
 *             component bytes N * 24; memory_idle: the same between ticks,
 *             after keel_runtime_release_memory.
 *  iterate    one keel_runtime_step of a VERSIONED query system rewriting
 *             pos += vel * dt over N entities, committed, vs the same loop
 *             over two malloc'd arrays; iterate_fused: the copy-on-write pass
 *             in plain C (a floor).
 *  parallel   the iterate tick on 2 workers vs 1 (parallel_2w);
 *             parallel_fused: the fused pass in plain C on two threads.
 *  spawn      N deferred spawns with 2 components plus the apply, vs
 *             appending to two arrays; destroy / destroy_seq: N destroys
 *             (shuffled / creation order) plus the apply, vs a sparse-set
 *             swap-remove.
 *  systems    64 empty callback systems per tick, transaction begin + commit
 *             included, per system on 1 and 2 workers, vs calls through a
 *             function-pointer table.
 *  side       two-row transfers as side transactions vs the same on a plain
 *             array under a mutex.
 *
 * Durability figures. Each measurement opens a fresh runtime on a fresh data
 * directory (mkdtemp under $TMPDIR, default /tmp; removed afterwards).
 * bench_world.c, the demo itself (tools/keel-world/world.c at 100k agents:
 * about 10% of the durable rows change per tick, IMMEDIATE trades that
 * `settle` waits for, unthrottled):
 *  wal        ticks/s with the WAL on (GROUP) vs off; wal_cpu: CPU ms per
 *             tick; wal_settle; fence: the fence's wall time per tick;
 *             wal_disk_bound: the ticks/s this disk admits at the tick's
 *             stored bytes; codec_planar*: the planar codec vs plain zstd on
 *             the demo's payloads; wal_extra_cpu: CPU per tick WAL on minus
 *             off vs the codec alone on the same bytes; wal_extra_floor: the
 *             codec plus the CPU of synced appends of the stored bytes.
 * bench_demo.c, a synthetic workload with the same share of changed rows
 * and almost no work per tick, which isolates the WAL's own cost:
 *  wal_min, wal_zstd*, *_bytes, wal_compression, wal_min_cpu, fence_min.
 *  checkpoint tick time p50/p99/max, ticks/s and CPU per tick with a
 *             checkpoint every CKPT_EVERY ticks vs none; ckpt_jitter_*.
 *  jitter     jitter_p99: tick p99 at 60 Hz with the WAL on and a checkpoint
 *             in progress vs the WAL off.
 * bench_commit.c, against one synced LMDB commit per 96-byte record:
 *  commit     durable ticks/s, GROUP (commit_group) and IMMEDIATE
 *             (commit_immediate).
 *  immediate  IMMEDIATE two-account transfers/s from 8 submitting threads
 *             while the main thread steps; p50/p99 latency; immediate_w1,
 *             immediate_1khz for the record.
 *  recovery   keel_runtime_recover of 1M entities + 1000 ticks of WAL vs the
 *             checkpoint alone (s); recovery_mbps / recovery_replay: raw WAL
 *             MB per CPU second vs reading + CRC-checking + decompressing the
 *             same records alone (the read ceiling); recovery_floor: that
 *             reading plus the value rows written into plain arrays.
 *  repl       (a 3-node NATS JetStream cluster on loopback that bench_nats.c
 *             starts; skipped without nats-server) repl_sync_immediate /
 *             _async: the immediate figure at 1 kHz with sync / async
 *             replication vs without; repl_stream_ceiling; the follower's lag
 *             at 60 Hz (repl_follower_lag_p50/p99, also `lag` alone); a fresh
 *             replica bootstrapping 1M entities vs a local recovery
 *             (repl_bootstrap, also `bootstrap` alone).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef void (*bench_fn)(const config *cfg);

/* In run order. memory runs first: its child is forked before the parent
 * has a large heap whose freed but resident pages the child could reuse
 * without growing its RSS. `covered_by`: a benchmark whose figures another
 * selected benchmark reports too is not run twice. */
static const struct bench {
    const char *name;
    bench_fn run;
    const char *covered_by;
} BENCHES[] = {
    { "memory", bench_memory, NULL },
    { "iterate", bench_iterate, NULL },
    { "parallel", bench_parallel, NULL },
    { "spawn", bench_spawn, NULL },
    { "destroy", bench_destroy, NULL },
    { "systems", bench_systems, NULL },
    { "side", bench_side, NULL },
    { "commit", bench_commit, NULL },
    { "wal", bench_wal, NULL },
    { "fence", bench_fence, "wal" },
    { "immediate", bench_immediate, NULL },
    { "recovery", bench_recovery, NULL },
    { "checkpoint", bench_checkpoint, NULL },
    { "jitter", bench_jitter, NULL },
    { "repl", bench_repl, NULL },
    { "bootstrap", bench_bootstrap, "repl" },
    { "lag", bench_lag, "repl" },
};
#define NBENCHES (sizeof BENCHES / sizeof BENCHES[0])

/* Names that select several benchmarks (figures that belong together). */
static const struct group {
    const char *name;
    const char *members[3];
} GROUPS[] = {
    { "iterate", { "iterate", "parallel" } },
    { "spawn", { "spawn", "destroy" } },
};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: keel-bench [all|NAME...] [--json] [--rounds N] [--entities N]\n"
            "  NAME          iterate|systems|spawn|commit|side|fence|recovery|checkpoint|jitter|\n"
            "                wal|immediate|memory|parallel|destroy|repl|bootstrap|lag (several may be named; default all).\n"
            "                iterate includes parallel, spawn includes destroy\n"
            "  --rounds N    rounds; figures are medians over rounds (default 7)\n"
            "  --entities N  entities of the in-memory figures (default 1000000); the durability\n"
            "                figures use the documented sizes (100k, 1M for recovery)\n"
            "  --json        one JSON object per line per figure, nothing else on stdout\n"
            "Each figure is measured side by side with its baseline in this run; text mode\n"
            "ends with a summary table. Data directories are made under $TMPDIR (default\n"
            "/tmp) and removed afterwards. docs/performance.md explains every figure.\n");
}

static bool parse_u32(const char *s, uint32_t min, uint32_t max, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = s ? strtoull(s, &end, 10) : 0;
    if (!s || *s == '\0' || *s == '-' || *end != '\0' || errno || v < min || v > max)
        return false;
    *out = (uint32_t)v;
    return true;
}

static int bench_index(const char *name)
{
    for (size_t i = 0; i < NBENCHES; i++)
        if (strcmp(name, BENCHES[i].name) == 0)
            return (int)i;
    return -1;
}

/* Mark what `name` selects; false when it names nothing. */
static bool select_name(const char *name, bool selected[NBENCHES])
{
    if (strcmp(name, "all") == 0) {
        for (size_t k = 0; k < NBENCHES; k++)
            selected[k] = true;
        return true;
    }
    for (size_t g = 0; g < sizeof GROUPS / sizeof GROUPS[0]; g++) {
        if (strcmp(name, GROUPS[g].name) != 0)
            continue;
        for (size_t m = 0; m < 3 && GROUPS[g].members[m]; m++)
            selected[bench_index(GROUPS[g].members[m])] = true;
        return true;
    }
    int b = bench_index(name);
    if (b < 0)
        return false;
    selected[b] = true;
    return true;
}

/* 0: run; 1: --help was printed; -1: bad arguments (message printed). */
static int parse_args(int argc, char **argv, config *cfg, bool selected[NBENCHES])
{
    bool named = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 1;
        } else if (strcmp(a, "--json") == 0) {
            cfg->json = true;
        } else if (strcmp(a, "--entities") == 0) {
            if (!parse_u32(i + 1 < argc ? argv[++i] : NULL, 1, UINT32_MAX - 1, &cfg->entities)) {
                fprintf(stderr, "keel-bench: --entities needs a number in [1, 4294967294]\n");
                return -1;
            }
        } else if (strcmp(a, "--rounds") == 0) {
            if (!parse_u32(i + 1 < argc ? argv[++i] : NULL, 1, 10000, &cfg->rounds)) {
                fprintf(stderr, "keel-bench: --rounds needs a number in [1, 10000]\n");
                return -1;
            }
        } else if (a[0] != '-' && select_name(a, selected)) {
            named = true;
        } else {
            fprintf(stderr, "keel-bench: unexpected argument '%s'\n", a);
            return -1;
        }
    }
    if (!named)
        select_name("all", selected);
    for (size_t k = 0; k < NBENCHES; k++) /* do not measure the same figures twice */
        if (selected[k] && BENCHES[k].covered_by && selected[bench_index(BENCHES[k].covered_by)])
            selected[k] = false;
    return 0;
}

int main(int argc, char **argv)
{
    config cfg = { .entities = 1000000, .rounds = 7, .json = false };
    bool selected[NBENCHES] = { false };
    int rc = parse_args(argc, argv, &cfg, selected);
    if (rc != 0) {
        if (rc < 0)
            usage(stderr);
        return rc < 0 ? 2 : 0;
    }
    if (!cfg.json) {
        printf("# keel-bench");
        for (size_t i = 0; i < NBENCHES; i++)
            if (selected[i])
                printf(" %s", BENCHES[i].name);
        printf(": entities=%u rounds=%u; medians over rounds, baseline and keel alternated in each round\n",
               cfg.entities, cfg.rounds);
        printf("%-16s %10s %-10s %10s %-10s %8s   %s\n", "# figure", "value", "", "baseline", "", "ratio",
               "target");
    }
    for (size_t i = 0; i < NBENCHES; i++)
        if (selected[i])
            BENCHES[i].run(&cfg);
    report_summary(&cfg);
    return 0;
}
