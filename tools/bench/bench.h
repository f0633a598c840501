/*
 * tools/bench/bench.h -- what the keel-bench files share: the run's
 * configuration, figures and their reporting (one line or one JSON object
 * per figure, and the summary table), the side-by-side runner, utilities,
 * data directories, and the demo-like workload of the durability figures.
 * Method and figures: the top comment of keel_bench.c.
 */
#ifndef KEEL_BENCH_H
#define KEEL_BENCH_H

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "keel/keel.h"
#include "keel_wal/wal.h"
#include "nats_cluster.h"
#include "world.h" /* keel-bench builds keel-world's world.c: its vec3 and workload */

/* ---- configuration and figures ------------------------------------------- */

typedef struct config {
    uint32_t entities;     /* of the in-memory figures */
    uint32_t rounds;       /* figures are medians over rounds */
    bool json;
} config;

typedef struct figure {
    const char *name;
    double value;          /* median of the subject */
    double baseline;       /* median of the baseline */
    const char *unit;      /* of value and baseline */
    double target;         /* a bound ... */
    bool target_on_ratio;  /* ... on the ratio (true) or on the value */
    bool at_least;         /* the bound is a lower bound (ticks/s, speed-ups), else an upper bound */
    bool no_target;        /* no target: the figure is printed for the record */
} figure;

/* A spin-wait hint (the plain-C probes' helper threads). */
static inline void bench_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Print a figure (text line or JSON object) and keep it for the summary. */
void report(const config *cfg, const figure *f);
/* A comment line in text mode only (JSON mode prints figures and nothing else). */
void note(const config *cfg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The table of every figure reported so far (text mode only). */
void report_summary(const config *cfg);

/* ---- side-by-side runner -------------------------------------------------- */

/* One measurement of one side: untimed setup, the timed part, untimed
 * teardown; returns the figure's quantity (ms per pass, ns per entity). */
typedef double (*measure_fn)(void *ctx);

/* Keep freed memory resident between rounds (see bench_util.c). */
void keep_heap_resident(void);
/* After one untimed warm-up of each side, each round alternates `reps`
 * measurements of each side (baseline first in even rounds) and keeps each
 * side's mean; f gets the medians of those means over the rounds. */
void run_pair(const config *cfg, uint32_t reps, measure_fn baseline, measure_fn subject, void *ctx, figure *f);

/* ---- utilities ------------------------------------------------------------ */

/* Read once per pass, so the compiler cannot fold or hoist the work away. */
extern volatile float g_dt;
/* Results are folded into this, so no measured loop is dead code. */
extern volatile double g_sink;

void *xmalloc(size_t n);
/* Exit with the library's sentence when rc is not 0. */
void check(int rc, const char *what);
uint64_t now_ns(void);
double process_cpu_s(void);
/* Median of v[0..n-1] (sorts v). */
double median(double *v, uint32_t n);
/* Nearest-rank percentile p in [0, 1] of v[0..n-1] (sorts v). */
double percentile(double *v, size_t n, double p);
uint64_t splitmix64(uint64_t *state);
uint32_t pow2_at_least(uint32_t n);
/* A VERSIONED 12-byte component {x, y, z: f32}. */
keel_component register_vec3(keel_world *w, const char *name);

/* A fresh directory under $TMPDIR (default /tmp) for a data directory;
 * removed (files and all) and freed by remove_tmpdir. */
char *make_tmpdir(const char *tag);
/* A NATS JetStream cluster of n servers on loopback (bench_nats.c): false
 * (and nothing left running) when nats-server is missing or never got ready. */
typedef nats_cluster bench_nats;
bool bench_nats_start(bench_nats *b, int n);
void bench_nats_stop(bench_nats *b);
void remove_tmpdir(char *dir);
/* Copy the flat files of data directory `from` into `to`. */
void copy_tmpdir(const char *from, const char *to);

/* Every WAL record of the open store st, in LSN order, checked and
 * decompressed with c (libkeel_wal alone), handed to fn with its header;
 * the payload is valid during the call. Exits on any error. */
typedef void (*wal_payload_fn)(const kw_header *h, const void *payload, void *arg);
void wal_each_payload(kw_store *st, kw_codec_ctx *c, wal_payload_fn fn, void *arg);

/* ---- the demo-like workload (bench_demo.c) --------------------------------- */

#define DEMO_ENTITIES 100000u      /* the demo-like workload (docs/performance.md) */
#define DEMO_TURN 10u              /* a row changes when (index + tick) % turn == 0 */
#define DEMO_CHURN 5u              /* spawns and destroys per tick (each) */
#define WAL_WARM_TICKS 20u         /* untimed ticks after the populating first tick */
#define WAL_TICKS 400u             /* timed ticks per measurement of the wal figures */
#define WAL_OFF INT32_MIN          /* a zstd level meaning "no data directory" */

/* One timed measurement of a runtime's ticks (wal_time_ticks). */
typedef struct wal_sample {
    double tps;                /* timed ticks / seconds (the last flush included) */
    double raw, stored;        /* fence bytes of the timed ticks (telemetry) */
    double rows;               /* value rows changed in the timed ticks (set by the caller) */
    double fence_ms;           /* mean fence duration per tick */
    double fsyncs;             /* synced LMDB commits during the timed ticks */
    double max_lag;            /* largest durable lag seen at a tick end, in ticks */
    double cpu_ms;             /* process CPU time per timed tick (all threads) */
} wal_sample;

/* Warm rt up (WAL_WARM_TICKS untimed ticks after the populating first one),
 * then time WAL_TICKS ticks plus the keel_flush that makes them durable;
 * the telemetry ring must hold WAL_TICKS + WAL_WARM_TICKS + 2 ticks. */
void wal_time_ticks(keel_runtime *rt, wal_sample *r);

/* n entities with VERSIONED pos and vel; on tick t a parallel query system
 * rewrites pos and vel of the rows whose (entity index + t) % turn == 0, a
 * callback system destroys `churn` entities and spawns `churn` new ones;
 * on_first_tick spawns the population. */
typedef struct demo {
    keel_runtime *rt;
    keel_component pos, vel;
    keel_query *all;
    uint32_t n, turn, churn;
    _Atomic uint64_t changed;  /* value rows the systems changed (pos and vel count one each) */
} demo;

typedef struct demo_opts {
    uint32_t n, turn, churn;
    const char *dir;           /* NULL: WAL off */
    int32_t zstd_level;
    int64_t ckpt_ticks;        /* checkpoint_every_ticks; byte and time triggers are off */
    uint32_t telemetry;        /* ring capacity, a power of two */
    bool schedule;             /* false: components only (a runtime to recover into) */
    keel_replication_desc repl; /* zero: not replicated */
} demo_opts;

void demo_open(demo *d, const demo_opts *o);
void demo_close(demo *d);
void step(keel_runtime *rt);

/* ---- the benchmarks --------------------------------------------------------- */

/* bench_memory.c: in-memory figures against plain-C baselines */
void bench_memory(const config *cfg);
void bench_iterate(const config *cfg);
void bench_parallel(const config *cfg);
void bench_spawn(const config *cfg);
void bench_destroy(const config *cfg);
void bench_systems(const config *cfg);
void bench_side(const config *cfg);
/* bench_demo.c: the demo workload with the WAL on and off */
void bench_wal(const config *cfg);
void bench_fence(const config *cfg);
/* bench_world.c: the demo (keel-world's world) with the WAL on and off */
void bench_wal_world(const config *cfg);
void bench_checkpoint(const config *cfg);
void bench_jitter(const config *cfg);
/* bench_commit.c: against one synced LMDB commit per record */
void bench_commit(const config *cfg);
void bench_immediate(const config *cfg);
void bench_repl(const config *cfg);
void bench_bootstrap(const config *cfg);
void bench_lag(const config *cfg);
/* bench_world.c: a read replica's lag behind the demo at 60 Hz, on the cluster at urls. */
void bench_repl_lag(const config *cfg, const char *urls);
void bench_recovery(const config *cfg);

#endif
