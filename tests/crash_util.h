/*
 * crash_util.h -- the crash-test workload, its children and its oracle, shared
 * by test_durable_crash (SIGKILL at chosen points), test_powerloss
 * (simulated power cuts through libkeel_powerloss) and test_failpoint (deaths
 * and I/O errors at named failpoints).
 *
 * The workload (deterministic: every decision is a pure function of
 * (SEED, tick, entity handle or counter), never of a worker or of time):
 *   pos     VERSIONED {x, y}, rewritten for about a quarter of the agents per
 *           tick (parallel query `move`);
 *   hp      SINGLE_VERSION, rewritten for a third of the agents per tick
 *           (parallel query `health`), destroy when it hits a multiple of 97;
 *   cache   TRANSIENT = f(pos), kept by `move`, rebuilt by on_first_tick after
 *           every open; `move` reads it to move pos and counts rows whose
 *           cache disagrees with pos (a recovered run that did not rebuild it
 *           diverges and reports the mismatches);
 *   born    VERSIONED, spawn values only, never written again;
 *   marked  tag added / removed by `tagger` / `untagger` (rows change
 *           archetype every tick); frozen: tag of "static" entities that are
 *           spawned with `born` and never touched again;
 *   account + ledger  VERSIONED, written only by side transactions: SLOTS
 *           IMMEDIATE transfers per tick between two of NACC accounts, id =
 *           (tick - 1) * SLOTS + slot + 1, the amount depending on the payer's
 *           balance. Slot 0 is a closure the controlling thread submits with
 *           keel_submit before each step (Engine-Pre; acknowledged when its
 *           ticket completes with 0); slots 1..TPT are made by `bank`, an
 *           exclusive callback system that runs first in the tick (acknowledged
 *           when keel_side_txn_commit returned 0, or, in some runs, when the
 *           ticket of keel_side_txn_commit_async completed with 0). A transfer
 *           whose id an account's ledger already holds was applied before a
 *           crash and is skipped (as keel-world's ledger), so a tick whose side
 *           transactions reached the disk while the tick itself did not runs
 *           again to the same state.
 *   `reaper` destroys 1/211 of the entities per tick, `spawner` spawns 5..14 or
 *   35..44 agents (alternating every 16 ticks) and one static per tick.
 *
 * The oracle. A reference run (in memory, in a child process, results in a
 * shared mapping) records keel_world_hash after every tick and, from inside
 * the deposit closure and `bank` (the closure runs before any system, `bank`
 * is exclusive and first, so the world then holds exactly the previous tick
 * plus the transfers committed so far), the hash after each prefix of a
 * tick's transfers. Side records reach the log in commit order and the
 * durable LSN only grows, so the side transactions on disk always form a
 * prefix of a tick's transfers. A recovered directory must therefore hold
 * exactly reference state R (R = the recovered tick) or "R plus the first j
 * transfers of tick R+1"; the continued run must reproduce the reference hash
 * at every following tick (ledger idempotency), up to the end tick. The
 * children run on 1 or 2 workers (changing across restarts), the reference on 1.
 *
 * Children report over a pipe: every acknowledged IMMEDIATE transfer (tick,
 * accounts, the values written), every completed tick (hash, transient
 * mismatches), flushes, checkpoints, and after recovery the recovered tick,
 * hash, every account's ledger and balance and probe entities. The parent
 * kills a child with SIGKILL when a chosen message arrives (after n
 * acknowledgements, after tick k, right after recovery started or finished,
 * or when the child holds still after a flush or a checkpoint) -- never after
 * a sleep -- and checks the next recovery against everything it was told: the
 * recovered state is a reference state, no acknowledged transfer is missing
 * (ledger >= id, balance as acknowledged), no tick the child saw durable is
 * missing (IMMEDIATE steps, keel_flush, keel_checkpoint), nothing past the
 * last tick that ran was recovered.
 *
 * A child is normally a fork of the test process. With plan.exec_env set it
 * execs the test binary again (argv[1] == CRASH_CHILD_ARG, handled by
 * crash_child_exec from the program's main) with those variables added to its
 * environment, so an LD_PRELOAD library (the power-loss shim) is loaded into
 * it; plan.may_die accepts a child that ends by SIGKILL on its own.
 *
 * Failpoints: plan.failpoints is armed in the child before anything runs
 * (the harness never lets a KEEL_FAILPOINTS of the environment in), and the
 * child reports every point that acts, before it acts (M_FIRED: a crash's
 * report is on the pipe before its SIGKILL, and a child that dies so counts
 * as `died`). With plan.fatal_ok a KEEL_EFATAL (or an open failing with the
 * injected code) ends the run with M_FATAL: what failed, the latched code,
 * the durable LSN, and what step, flush, checkpoint and submit return after
 * the latch.
 *
 * Failures in the parent are collected (the first one is kept), the child is
 * killed and the temporary directory removed before the test asserts.
 * KEEL_CRASH_SEED=<n> changes the kill points; KEEL_CRASH_VERBOSE=1 prints every
 * child's story; KEEL_CRASH_KEEP=1 keeps the data directories.
 */
#ifndef KEEL_CRASH_UTIL_H
#define KEEL_CRASH_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "keel/keel.h"

/* ---- workload parameters ------------------------------------------------------------- */

#define SEED 0x6b65656c63726173ull
#define NACC 16u               /* accounts: entities 0 .. NACC-1 (spawned first) */
#define TPT 4u                 /* bank transfers per tick */
#define SLOTS (TPT + 1u)       /* side transactions per tick: the submitted deposit, then the bank's */
#define INIT_BAL 1000
#define INIT_AGENTS 2500u
#define INIT_STATICS 200u
#define CHUNK_ROWS 256u
#define TMAX 150u              /* the reference runs this far */
#define MAX_ID (TMAX * SLOTS)
#define PROBE_DESTROY_TICK 23u /* probe 0: an entity destroyed at this tick */
#define PROBE_STATIC_TICK 11u  /* probe 1: a static entity spawned at this tick */

typedef struct born2 {
    uint64_t tick, salt;
} born2;

/* ---- the reference (shared mapping written by the reference child) ------------------- */

typedef struct refdata {
    int ok;
    char err[512];
    uint64_t hash[TMAX + 1];              /* after tick t; [0] = the empty world */
    uint64_t prefix[TMAX + 1][SLOTS + 1]; /* tick t: previous tick + its first j side transactions */
    uint32_t acc[MAX_ID + 1][2];          /* transfer id: accounts */
    int64_t bal[MAX_ID + 1][2];           /* transfer id: balances written */
    keel_entity probe[2];                 /* 0: destroyed at PROBE_DESTROY_TICK; 1: static born at PROBE_STATIC_TICK */
    uint32_t probe_gen[2][TMAX + 1];      /* slot generation after tick t */
    uint8_t probe_alive[2][TMAX + 1];
    born2 probe_born;                     /* probe 1's values */
    uint64_t min_entities, max_entities;
} refdata;

/* ---- messages child -> parent --------------------------------------------------------- */

enum {
    M_STARTED = 1,  /* the runtime is set up: keel_runtime_recover starts now */
    M_RECOVERED,    /* tick, hash, ledgers, balances, probes, last_lsn */
    M_ACK,          /* an IMMEDIATE transfer committed (returned 0) */
    M_TICK,         /* keel_runtime_step returned 0: tick, hash */
    M_FLUSHED,      /* keel_flush returned rc after tick */
    M_CKPT,         /* keel_checkpoint returned rc after tick */
    M_HOLD,         /* the child stops and waits to be killed */
    M_DONE,         /* clean close done */
    M_FAIL,         /* text says what */
    M_FIRED,        /* a failpoint acts: fp, fp_action, aux = its hit number */
    M_FATAL,        /* plan.fatal_ok: a call failed with KEEL_EFATAL (or the open with rc); the probes after it */
};

/* M_FATAL's probes, made once the runtime latched fatal: each must be KEEL_EFATAL. */
enum { PROBE_STEP, PROBE_FLUSH, PROBE_CHECKPOINT, PROBE_SUBMIT, NPROBES };

typedef struct msg {
    uint32_t type;
    int32_t rc;       /* FATAL: the failed call's code */
    uint64_t tick, hash, id;
    uint64_t aux;     /* TICK: transient mismatches; RECOVERED: checkpoint tick; FIRED: hit */
    uint64_t aux2;    /* TICK: transfers skipped; RECOVERED: keel_recovery.tick */
    uint64_t last_lsn; /* RECOVERED: keel_recovery.last_lsn; FATAL: keel_durable_lsn once latched */
    uint32_t a, b, slot, fresh;
    int64_t bal_a, bal_b;
    uint64_t ledger[NACC];
    int64_t bal[NACC];
    uint32_t probe_alive[2], probe_gen[2];
    born2 probe_born;
    int32_t fatal;              /* FATAL: keel_runtime_fatal once latched */
    int32_t probe_rc[NPROBES];  /* FATAL */
    int32_t dep_rc, bank_rc;    /* FATAL: the deposit's ticket when the step failed, the bank's first error */
    uint32_t late_commits;      /* FATAL: bank commits that returned 0 after one returned KEEL_EFATAL */
    char fp[48], fp_action[16]; /* FIRED */
    char text[240];
} msg;

/* ---- a child's plan --------------------------------------------------------------------- */

typedef struct plan {
    const char *dir;           /* NULL: in memory */
    bool reference;            /* fill the shared refdata */
    keel_durability mode;
    int64_t ckpt_every;        /* durable.checkpoint_every_ticks */
    int32_t workers;
    uint64_t map_size;         /* durable.map_size (0: default) */
    bool async_bank;           /* bank: keel_side_txn_commit_async, tickets waited at its end */
    bool wal_retain;           /* durable.wal_retain: checkpoints keep the WAL they cover */
    uint64_t until;            /* run ticks until keel_runtime_tick reaches it */
    uint64_t flush_at;         /* after this tick: keel_flush */
    uint64_t checkpoint_at;    /* after this tick: keel_checkpoint */
    bool hold_after_recover;   /* report, then wait to be killed (no tick) */
    bool hold_at_end;          /* at `until`: wait to be killed instead of closing */
    keel_entity probe[2];
    const char *const *exec_env; /* non-NULL: exec the test binary with these "NAME=value" added (NULL-terminated) */
    bool may_die;              /* the child may end by SIGKILL on its own (a simulated power cut) */
    const char *failpoints;    /* keel_failpoints_set in the child before anything else (NULL: none) */
    bool fatal_ok;             /* KEEL_EFATAL (or a failed open) ends the run with M_FATAL instead of M_FAIL */
} plan;

/* ---- the parent: children and the oracle ---------------------------------------------------- */

typedef struct ack_rec {
    bool acked;
    uint32_t a, b;
    int64_t bal_a, bal_b;
} ack_rec;

typedef struct oracle {
    const refdata *ref;
    ack_rec acks[MAX_ID + 1];
    uint64_t nacks;
    uint64_t max_ran;        /* highest tick a child reported done (or recovered) */
    uint64_t slack;          /* 1: the last child may have finished a tick it did not report; 0: it held */
    uint64_t min_durable;    /* recovery must reach this tick (IMMEDIATE steps, flush, checkpoint, clean close) */
    uint64_t last_recovered;
    msg last_rec;            /* the last RECOVERED message */
    const char *scenario;
    int last_j;              /* transfers of tick R+1 in the last recovered state */
    bool failed;
    char fail[1536];
    /* statistics for the failure messages */
    uint32_t kills, recoveries, prefix_recoveries, ckpt_recoveries;
} oracle;

typedef enum trig_kind { TRIG_NONE, TRIG_STARTED, TRIG_RECOVERED, TRIG_ACKS, TRIG_TICK, TRIG_CKPT } trig_kind;

typedef struct trigger {
    trig_kind kind;
    uint64_t n;
} trigger;

typedef struct outcome {
    bool started, recovered, held, done, killed;
    bool died;               /* ended by SIGKILL it raised itself (plan.may_die, or a failpoint's crash) */
    msg rec;
    uint64_t last_tick, acks;
    int status;
    /* failpoints: the first that acted, and every one that did (bit i = keel_failpoint_name(i)) */
    uint32_t nfired;
    msg first_fired;
    uint64_t fired_mask;
    bool fatal;              /* M_FATAL arrived */
    msg fatal_msg;
} outcome;

typedef struct tmpdir {
    char base[64];
    char data[96];
} tmpdir;

/* fork(), stdio flushed first; the child dies with its parent (SIGKILL). */
pid_t fork_child(void);
/* The reference run, in a child; munmap(ref, sizeof *ref) when done. */
refdata *reference_run(void);

void oracle_init(oracle *o, const refdata *ref, const char *scenario);
void ofail(oracle *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Run one child with plan p to its end (or its trigger), checking every message. */
outcome run_child(oracle *o, const plan *p, trigger tr);
plan base_plan(const char *dir, keel_durability mode, int64_t ckpt_every, uint64_t until);
/* Rounds of children on one directory, each killed at a point of one of `kinds`. */
void crash_rounds(oracle *o, const char *dir, keel_durability mode, int64_t ckpt_every, int rounds, uint64_t end,
                  uint64_t salt, const int *kinds, int nkinds);
/* Run to the end without a kill, then reopen: the end state, recovered exactly. */
void finish(oracle *o, const char *dir, keel_durability mode, int64_t ckpt_every, uint64_t end);
/* Remove the directory, then fail the test with the oracle's first failure. */
void oracle_assert(oracle *o, tmpdir *d);
/* A scenario's start: the reference run (returned), the fresh directory d, the oracle o on both. */
refdata *scenario_begin(tmpdir *d, oracle *o, const char *scenario);
/* Its end: oracle_assert, then the reference run unmapped. */
void scenario_end(oracle *o, tmpdir *d, refdata *ref);

void tmpdir_make(tmpdir *d);
void tmpdir_remove(tmpdir *d);
uint64_t crash_mix(uint64_t z);
uint64_t rng_next(uint64_t *s);
uint64_t rng_seed(uint64_t salt); /* from KEEL_CRASH_SEED */

/* argv[1] of a child exec'd by child_start (plan.exec_env). */
#define CRASH_CHILD_ARG "--crash-child"
/* The exec'd child's entry: call from main when argv[1] is CRASH_CHILD_ARG. */
_Noreturn void crash_child_exec(int argc, char **argv);

#endif
