/*
 * kc.h -- keel-crash's internal interfaces: report lines (line.c), the child
 * process (child.c), the oracle (oracle.c) and the crash schedule (main.c).
 * keel-crash links libc and pthreads only: it talks to keel-world through its
 * command line, its environment and the --report-fd protocol (docs/reliability.md).
 */
#ifndef KC_H
#define KC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "nats_cluster.h"

#define KC_TPT 8u          /* keel-world's trades per tick: trade id = t * KC_TPT + k + 1 */
#define KC_MAX_FIELDS 16u
#define KC_LINE_MAX 1024u  /* keel-world promises < 512 bytes a line */

/* ---- report lines (line.c) ------------------------------------------------------------ */

/* One report line: its first word and its key=value fields (pointers into buf). */
typedef struct kc_line {
    const char *kind;
    uint32_t n;
    const char *key[KC_MAX_FIELDS];
    const char *val[KC_MAX_FIELDS];
    char buf[KC_LINE_MAX];
} kc_line;

bool kc_line_parse(kc_line *l, const char *text, size_t len);
const char *kc_get(const kc_line *l, const char *key);
bool kc_get_u64(const kc_line *l, const char *key, uint64_t *out);
bool kc_get_i64(const kc_line *l, const char *key, int64_t *out);
bool kc_get_hex(const kc_line *l, const char *key, uint64_t *out);

/* An item list ("3,1,2" or "-") in canonical form ("1,2,3", "-"), malloc'ed;
 * NULL when it does not parse. *count gets the number of items. */
char *kc_items_canon(const char *s, uint64_t *count);

/* splitmix64: the schedule's generator. */
uint64_t kc_mix(uint64_t z);
uint64_t kc_rand(uint64_t *state);

double kc_now_ms(void);

/* ---- the child (child.c) -------------------------------------------------------------- */

typedef enum kc_trig_kind {
    KC_TRIG_NONE,  /* run to the end (or to its own fault) */
    KC_TRIG_EXEC,  /* delay_us after the fork: while exec'ing, opening or recovering */
    KC_TRIG_START, /* the `start` line: right after recovery */
    KC_TRIG_STATE, /* the first `state-end` line: recovery done and reported, the first tick starting */
    KC_TRIG_TICK,  /* the `tick` line of tick >= n */
    KC_TRIG_ACKS,  /* the n-th `ack` line of this child */
    KC_TRIG_FINAL, /* the `final` line: during the clean close */
} kc_trig_kind;

typedef struct kc_trigger {
    kc_trig_kind kind;
    uint64_t n;
    uint32_t delay_us; /* SIGKILL this long after the trigger (0: at once) */
} kc_trigger;

#define KC_MAX_ENV 8u

typedef struct kc_spec {
    const char *world;      /* keel-world's path */
    const char *data;       /* data directory; NULL: --memory */
    uint64_t seed, until;
    uint32_t entities;
    int workers;
    int64_t ckpt_every;     /* --checkpoint-every; 0: never */
    const char *durability; /* NULL: keel-world's default */
    bool wal_retain, prefix;
    const char *extra_arg;  /* one more argument (tests of the oracle), or NULL */
    const char *const *more; /* more arguments, NULL-terminated (replication's), or NULL */
    const char *tick_rate;  /* --tick-rate; NULL: "0" (as fast as it goes) */
    const char *env[KC_MAX_ENV]; /* NAME=VALUE added to the environment */
    const char *log;        /* the child's stdout and stderr */
    kc_trigger trig;
    double hang_ms;         /* SIGKILL when no line came for this long */
} kc_spec;

typedef struct kc_exit {
    bool spawned;           /* fork and exec worked */
    bool killed;            /* keel-crash sent the SIGKILL */
    bool hung;              /* ... because no line came for hang_ms */
    int status;             /* waitpid status */
    double start_ms;        /* fork to the `start` line; < 0: none */
} kc_exit;

typedef void (*kc_line_fn)(void *user, const kc_line *l);

/* Run keel-world with s, hand every report line to fn (if not NULL), kill it per s->trig.
 * 0, or -1 when it could not be started (errno set, nothing to wait for). */
int kc_child_run(const kc_spec *s, kc_line_fn fn, void *user, kc_exit *out);

/* A child run asynchronously: its report pipe read when the caller's poll
 * says so (kc_proc_read), several children at once. */
typedef struct kc_proc {
    pid_t pid;              /* -1 once reaped */
    int fd;                 /* the report pipe's read end; -1 at its end */
    double t0, last;        /* the fork, the last bytes read */
    struct kc_reader *r;
} kc_proc;

/* Fork and exec keel-world with s (s->trig is not used). 0, or -1 (errno set). */
int kc_proc_start(const kc_spec *s, kc_proc *p);
/* One read of the pipe (it blocks when nothing is there): every complete
 * line to fn. 1 when bytes came, 0 at the pipe's end (fd closed), -1 on error. */
int kc_proc_read(kc_proc *p, kc_line_fn fn, void *user);
/* Every line the pipe holds now, without waiting. */
void kc_proc_drain(kc_proc *p, kc_line_fn fn, void *user);
/* Close the pipe and wait for the child: its waitpid status. */
int kc_proc_reap(kc_proc *p);

/* Run argv with env_add (NAME=VALUE or NULL) added to the environment, its
 * stdout -- and stderr too when with_stderr, else stderr is ours -- into buf
 * (NUL-terminated, truncated to cap); its exit status, or -1. */
int kc_capture(char *const argv[], const char *env_add, bool with_stderr, char *buf, size_t cap);

/* A child's log: its last non-empty line, and the recovery time from
 * `recovered tick=<T> in <X> ms` (-1 without). */
void kc_read_log(const char *path, char *tail, size_t cap, double *rec_ms);
/* Remove a directory tree. */
void kc_rm_tree(const char *path);

/* Set by SIGINT / SIGTERM: the current child is killed, the run stops. */
extern volatile int kc_stop;

/* ---- the oracle (oracle.c) ------------------------------------------------------------ */

/* What a trade wrote (from an `ack` line). */
typedef struct kc_trade {
    uint64_t a, b;
    int64_t a_coins, b_coins;
    char *a_items, *b_items; /* canonical */
} kc_trade;

/* The uninterrupted run: the state hash after every tick, after every prefix
 * of every tick's trades, every trade's outcome, the economy's constants. */
typedef struct kc_ref {
    uint64_t until;
    uint64_t *hash;                 /* [until + 1]; [0]: the `start` state */
    uint64_t (*prefix)[KC_TPT + 1]; /* [until + 2]: tick t after its first j trades */
    uint16_t *prefix_have;          /* bit j: prefix[t][j] was reported */
    kc_trade *trade;                /* [ntrades + 1], by id */
    uint64_t ntrades;
    bool *have_trade;
    int64_t money;
    uint64_t items;
    uint64_t accounts;
    bool have_end;
    uint64_t final_hash;
    char err[256];                  /* the first inconsistency seen while reading it */
} kc_ref;

int kc_ref_build(kc_ref *r, const kc_spec *s, char *why, size_t cap);
void kc_ref_free(kc_ref *r);

/* Counters of one mode. */
typedef struct kc_stats {
    uint64_t rounds, crashes, recoveries, mid_tick, ckpt_ticks;
    uint64_t lost, mismatches, violations;
    uint64_t *rticks, nrticks, caprticks; /* recovered ticks */
    double rec_ms_sum;
    uint64_t rec_ms_n;
} kc_stats;

/* One data directory's history, from fresh to --until-tick: what was
 * acknowledged, what must have survived. */
typedef struct kc_lap {
    const kc_ref *ref;
    kc_stats *st;
    const char *mode;
    uint32_t lap, child;     /* for messages */
    uint8_t *acked;          /* by id: 1 acknowledged, 2 and reported lost */
    kc_trade *ack;
    uint64_t min_durable;    /* recovery must reach this tick (IMMEDIATE ticks, a clean close) */
    uint64_t max_ran;        /* the last tick a child reported */
    uint64_t pos;            /* the tick the directory holds, as far as we know */
    bool reached_end;        /* a child ran to --until-tick and exited 0 */
    bool broken;             /* it left the reference (a mismatch): later restarts would only
                                repeat it, so the lap ends there */
    bool openable;           /* a child opened it as an existing directory, or closed it cleanly */
    uint64_t *ack_epoch;     /* failover mode (kc_lap_epochs): by id, the earliest epoch that
                                acknowledged it; NULL in the other modes */
    bool selftest_ack;       /* KEEL_CRASH_SELFTEST=ack: book acks one tick late */
    bool selftest_epoch;     /* KEEL_CRASH_SELFTEST=epoch: book acks in epoch 0 */
    int64_t selftest_money;  /* KEEL_CRASH_SELFTEST=money: expect this many coins more */
} kc_lap;

/* The run of one child on a lap: fed line by line (kc_run_line), then closed. */
typedef struct kc_acct {
    uint64_t e, ledger, nitems;
    int64_t coins;
    char *items;
} kc_acct;

typedef struct kc_run {
    kc_lap *lap;
    bool immediate;          /* --durability immediate: a reported tick is durable */
    bool started, fresh, diverged, final_seen, in_block;
    bool has_epoch;          /* its start line named an epoch (a replicated node) */
    uint64_t epoch;
    uint64_t R, rec_hash, final_tick, final_hash;
    int j;                   /* trades of tick R+1 in the recovered state; -1: no reference state */
    uint32_t blocks;         /* state-end lines seen */
    kc_acct *acct;
    uint64_t nacct, capacct;
    uint64_t ticks, last_tick, acks;
    bool bad_line;
} kc_run;

void kc_lap_init(kc_lap *lap, const kc_ref *ref, kc_stats *st, const char *mode, uint32_t n);
void kc_lap_free(kc_lap *lap);
/* Failover mode: acknowledgements belong to epochs. A state an epoch starts
 * from must hold every trade acknowledged in an earlier epoch (not those of
 * later ones, whose lines may arrive first); a state at the end of a run,
 * every trade acknowledged up to its own epoch. 0, or -1 (no memory). */
int kc_lap_epochs(kc_lap *lap);
void kc_run_init(kc_run *run, kc_lap *lap, bool immediate);
void kc_run_line(void *run, const kc_line *l);
/* After the child ended: account for how it ended. fault: what was injected
 * ("kill", "crash", "eio", "powerloss", or NULL for a clean run). Returns
 * true when the child crashed or failed as injected (a fault happened). */
bool kc_run_end(kc_run *run, const kc_exit *ex, const char *fault, double rec_ms, const char *log_tail);
void kc_run_free(kc_run *run);

/* A problem: printed (the first ones), and counted in *counter. */
void kc_problem(const kc_lap *lap, uint64_t *counter, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
extern bool kc_verbose;

/* ---- failover mode (failover.c) ------------------------------------------------------- */

/* What failover mode needs from keel-crash's set-up. */
typedef struct kc_fo_desc {
    const char *world, *work;   /* keel-world; the work directory */
    const char *wal;            /* keel-wal, to verify a killed node's directory; "" without */
    uint64_t *verified;         /* directories it verified */
    const kc_ref *ref;
    kc_stats *st;
    uint64_t seed, until;
    uint32_t entities;
    bool keep;                  /* keep the directories and logs */
    uint32_t *laps;             /* keel-crash's lap counter */
} kc_fo_desc;

/* Counters only failover mode has, printed under the table. */
typedef struct kc_fo_stats {
    uint64_t promotions, after_kill, after_stop, unplanned, fenced, nats_kills, rejoins, two_primaries;
} kc_fo_stats;

/* rounds faults on a primary and its standby (kill -9, SIGSTOP, a NATS node
 * killed) on a 3-node cluster; false when NATS could not be started. */
bool kc_failover_run(const kc_fo_desc *d, uint64_t rounds, kc_fo_stats *out);

/* Is trade `id` in a state recovered at tick R with j trades of tick R+1? */
bool kc_trade_in_state(uint64_t id, uint64_t R, int j);

#endif
