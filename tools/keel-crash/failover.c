/*
 * failover.c -- keel-crash --mode failover: one world on a 3-node NATS
 * JetStream cluster, a primary (--replicate sync) and a standby, each on its
 * own data directory, and a fault per round on the primary at an instant
 * chosen from its reports:
 *
 *   kill       SIGKILL: the standby must take over
 *   stop       SIGSTOP: the standby takes over; then SIGCONT, and the old
 *              primary must be fenced (exit non-zero, no final line)
 *   nats+kill  a NATS node SIGKILLed, then the primary
 *   nats       a NATS node SIGKILLed under a running primary, started again
 *              15 ticks later
 *
 * The node that lost its role rejoins as a standby on its own directory
 * (discarding what never reached the stream), so roles alternate. A standby
 * reports from its promotion on, like a child that recovered: its `start`
 * line is the state it took over (checked as a recovery, against every
 * trade acknowledged before), and its ticks, acknowledgements and final
 * hash are checked against the reference. Every `start` line names its
 * epoch, every acknowledgement belongs to its node's epoch, and a trade
 * acknowledged in epoch E must be in the state of every later epoch's
 * start: otherwise two primaries acknowledged at once. A standby that never
 * took over runs to --until-tick and must end on the reference's hash.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kc.h"

#define FO_LEASE_MS "1000"
#define FO_TICK_RATE "100"    /* a world that lasts long enough for several takeovers per lap */
#define FO_RETAIN "2000"      /* records kept behind the published checkpoint: the stream stays small */
#define FO_HANG_MS 60000.0    /* a primary silent this long hangs */
#define FO_PROMOTE_MS 60000.0 /* a fault to the standby's promotion, at most */
#define FO_END_MS 120000.0    /* the world's end to the standby's, at most */
#define FO_NATS_LAPS 4        /* a fresh cluster every few laps: bounded storage */
#define FO_MAX_EPOCHS 512
#define FO_MAX_STARTS 400u

typedef enum fo_kind { FO_NONE, FO_KILL, FO_STOP, FO_NATS_KILL, FO_NATS } fo_kind;
static const char *const kind_names[] = {"none", "kill", "stop", "nats+kill", "nats"};

/* The round's fault: a trigger on the primary's lines, a delay, the act. */
typedef struct fo_plan {
    fo_kind kind;
    int target;             /* the node index */
    kc_trig_kind trig;      /* KC_TRIG_TICK (t >= n), KC_TRIG_ACKS (its n-th), KC_TRIG_STATE (its recovered state) */
    uint64_t n;
    double delay_ms, kill_after_ms; /* after the trigger; nats+kill: then the primary */
    bool fired;
    double at;              /* when to act next */
    int stage;              /* acts done: 1 the fault (or its NATS kill), 2 nats+kill's SIGKILL */
    double acted_at;
    int nats_node;          /* the NATS node it killed, -1 */
    uint64_t resume_tick;   /* nats: start the node again at this primary tick */
} fo_plan;

typedef struct fo_lap fo_lap;

typedef struct fo_node {
    fo_lap *fl;
    int idx;
    kc_proc proc;
    kc_run run;
    bool up;                /* its process runs */
    bool reading;           /* its pipe is being read: no drain from inside */
    bool standby;           /* started --standby and not promoted */
    bool deposed;           /* it ran the world, and another node took over since */
    bool killed, stopped;
    bool exit_pending;      /* it ran the world and exited non-zero with no fault of ours:
                               fenced if a promotion explains it, a violation otherwise */
    int status;
    double pending_since;
    uint64_t epoch;
    uint32_t starts;
    char dir[PATH_MAX + 64], log[PATH_MAX + 96];
} fo_node;

struct fo_lap {
    const kc_fo_desc *d;
    kc_fo_stats *fs;
    nats_cluster *ns;
    uint64_t *rounds_left;
    kc_lap lap;
    fo_node node[2];
    char world[32];
    int64_t ckpt_every;
    const char *durability;
    int workers;
    uint64_t rng;
    fo_plan plan;
    bool aborted;
    double t0;              /* the lap's start */
    double end_at;          /* when the world reached its end (a clean final), 0 before */
    struct fo_epoch {
        uint64_t epoch, R;  /* it started from tick R */
        int j;              /* ... and j trades of tick R + 1 */
        uint64_t durable;   /* IMMEDIATE: the last tick its node reported (then on the stream) */
    } ep[FO_MAX_EPOCHS];
    uint32_t nep;
};

static void say(const fo_lap *fl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const fo_lap *fl, const char *fmt, ...)
{
    if (!kc_verbose)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[failover lap %u +%.1fs] ", fl->lap.lap, (kc_now_ms() - fl->t0) / 1000);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ---- nodes ---------------------------------------------------------------------------- */

static void node_spawn(fo_lap *fl, fo_node *n, bool primary)
{
    const kc_fo_desc *d = fl->d;
    if (++n->starts > FO_MAX_STARTS) { /* a node that ends as soon as it starts, again and again */
        kc_problem(&fl->lap, &fl->lap.st->violations, "node %c was started %u times in one lap", 'a' + n->idx,
                   FO_MAX_STARTS);
        fl->aborted = true;
        return;
    }
    if (d->keep)
        snprintf(n->log, sizeof n->log, "%s-%u.log", n->dir, n->starts);
    else
        snprintf(n->log, sizeof n->log, "%s.log", n->dir);
    const char *more[] = {"--nats", fl->ns->urls, "--world", fl->world, "--lease-ms", FO_LEASE_MS,
                          "--retain-records", FO_RETAIN, primary ? "--replicate" : "--standby",
                          primary ? "sync" : NULL, NULL};
    kc_spec s = {.world = d->world, .data = n->dir, .seed = d->seed, .until = d->until, .entities = d->entities,
                 .workers = fl->workers, .ckpt_every = fl->ckpt_every, .durability = fl->durability,
                 .log = n->log, .more = more, .tick_rate = FO_TICK_RATE};
    kc_run_init(&n->run, &fl->lap, !strcmp(fl->durability, "immediate"));
    n->standby = !primary;
    n->deposed = n->killed = n->stopped = n->exit_pending = false;
    n->epoch = 0;
    if (kc_proc_start(&s, &n->proc)) {
        kc_problem(&fl->lap, &fl->lap.st->violations, "cannot start keel-world: %s", strerror(errno));
        kc_run_free(&n->run);
        fl->aborted = true;
        return;
    }
    n->up = true;
    fl->fs->rejoins += n->starts > 1;
    say(fl, "node %c starts as %s (pid %d)", 'a' + n->idx, primary ? "primary" : "standby", (int)n->proc.pid);
}

static void on_line(void *user, const kc_line *l);

/* Another node's promotion: this one ran the world until now. */
static void depose(fo_node *o)
{
    if (o->standby || !o->run.started)
        return;
    o->deposed = true;
    if (o->stopped) { /* it wakes up to find its lease gone: fenced */
        kill(o->proc.pid, SIGCONT);
        o->stopped = false;
    }
    if (o->up && !o->reading)
        kc_proc_drain(&o->proc, on_line, o); /* what it reported before the takeover comes first */
}

static void finish_run(fo_lap *fl, fo_node *n, const char *fault);

/* The round is over, however it ended: a NATS node it killed starts again
 * (healthy later: nats_cluster_ready). */
static void plan_clear(fo_lap *fl)
{
    fo_plan *p = &fl->plan;
    if (p->nats_node >= 0 && fl->ns->pid[p->nats_node] <= 0) {
        if (nats_cluster_restart(fl->ns, p->nats_node))
            kc_problem(&fl->lap, &fl->lap.st->violations, "NATS node %d cannot be started again", p->nats_node);
        else
            say(fl, "NATS node %d started again", p->nats_node);
    }
    *p = (fo_plan){.kind = FO_NONE, .nats_node = -1};
}

/* n's start line, of epoch `epoch`, says it took the world over. */
static void promote(fo_lap *fl, fo_node *n, uint64_t epoch)
{
    fo_node *o = &fl->node[!n->idx];
    fo_plan *p = &fl->plan;
    n->standby = false;
    fl->fs->promotions++;
    if (o->run.has_epoch && o->epoch > epoch)
        n->deposed = true; /* a late line: o took over after n; n is fenced at its first publish */
    else
        depose(o);
    if (o->exit_pending) { /* it exited before this line was read: fenced; it rejoins now */
        finish_run(fl, o, "fenced");
        if (!fl->lap.reached_end && !fl->aborted && !kc_stop)
            node_spawn(fl, o, false);
    }
    bool planned = p->kind != FO_NONE && p->kind != FO_NATS && p->stage > 0;
    if (planned && p->kind == FO_STOP)
        fl->fs->after_stop++;
    else if (planned)
        fl->fs->after_kill++;
    else
        fl->fs->unplanned++;
    say(fl, "node %c promoted (%s)", 'a' + n->idx, planned ? kind_names[p->kind] : "unplanned");
    plan_clear(fl);
    /* now and then the new primary dies right after taking over */
    if (*fl->rounds_left && kc_rand(&fl->rng) % 5 == 0) {
        (*fl->rounds_left)--;
        fl->lap.st->rounds++;
        *p = (fo_plan){.kind = FO_KILL, .target = n->idx, .trig = KC_TRIG_STATE, .nats_node = -1,
                       .delay_ms = (double)(kc_rand(&fl->rng) % 300)};
    }
}

static void record_epoch(fo_lap *fl, fo_node *n, const kc_line *l)
{
    if (!kc_get_u64(l, "epoch", &n->epoch)) {
        kc_problem(&fl->lap, &fl->lap.st->violations, "a replicated node's start line names no epoch");
        return;
    }
    for (uint32_t i = 0; i < fl->nep; i++)
        if (fl->ep[i].epoch == n->epoch) {
            fl->fs->two_primaries++;
            kc_problem(&fl->lap, &fl->lap.st->violations, "epoch %" PRIu64 " began twice (ticks %" PRIu64 " and %"
                       PRIu64 "): two primaries", n->epoch, fl->ep[i].R, n->run.R);
        }
    if (fl->nep < FO_MAX_EPOCHS)
        fl->ep[fl->nep++] = (struct fo_epoch){n->epoch, n->run.R, n->run.j < 0 ? 0 : n->run.j, n->run.R};
}

/* An IMMEDIATE node's tick line: that tick is on the stream. */
static void record_tick(fo_lap *fl, const fo_node *n, const kc_line *l)
{
    uint64_t t;
    if (strcmp(fl->durability, "immediate") || !n->run.has_epoch || !kc_get_u64(l, "t", &t))
        return;
    for (uint32_t i = 0; i < fl->nep; i++)
        if (fl->ep[i].epoch == n->epoch && t > fl->ep[i].durable)
            fl->ep[i].durable = t;
}

/* Does this line of the plan's target fire its trigger? */
static void check_trigger(fo_lap *fl, fo_node *n, const kc_line *l)
{
    fo_plan *p = &fl->plan;
    if (p->kind == FO_NONE || p->fired || p->target != n->idx || !l->kind)
        return;
    uint64_t t;
    bool fires = (p->trig == KC_TRIG_TICK && !strcmp(l->kind, "tick") && kc_get_u64(l, "t", &t) && t >= p->n) ||
                 (p->trig == KC_TRIG_ACKS && !strcmp(l->kind, "ack") && n->run.acks >= p->n) ||
                 (p->trig == KC_TRIG_STATE && !strcmp(l->kind, "state-end"));
    if (fires) {
        p->fired = true;
        p->at = kc_now_ms() + p->delay_ms;
    }
}

static void on_line(void *user, const kc_line *l)
{
    fo_node *n = user;
    fo_lap *fl = n->fl;
    bool start = l->kind && !strcmp(l->kind, "start");
    uint64_t epoch = 0;
    if (start && n->standby) /* the epoch is read again, checked, by record_epoch */
        promote(fl, n, kc_get_u64(l, "epoch", &epoch) ? epoch : 0);
    kc_run_line(&n->run, l);
    if (l->kind && !strcmp(l->kind, "tick"))
        record_tick(fl, n, l);
    if (start)
        record_epoch(fl, n, l);
    if (start && !fl->node[!n->idx].starts) /* the lap's standby: once the primary made the stream */
        node_spawn(fl, &fl->node[!n->idx], false);
    check_trigger(fl, n, l);
}

/* The `final tick=T hash=H` line of a standby's stdout. */
static bool log_final(const char *path, uint64_t *tick, uint64_t *hash)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    bool found = false;
    while (f && fgets(line, sizeof line, f))
        found |= sscanf(line, "final tick=%" SCNu64 " hash=%" SCNx64, tick, hash) == 2;
    if (f)
        fclose(f);
    return found;
}

static void finish_run(fo_lap *fl, fo_node *n, const char *fault)
{
    char tail[1024];
    double rec_ms;
    kc_read_log(n->log, tail, sizeof tail, &rec_ms);
    kc_exit ex = {.spawned = true, .killed = n->killed, .status = n->status, .start_ms = -1};
    kc_run_end(&n->run, &ex, fault, -1, tail);
    if (fault && !strcmp(fault, "fenced") && !(WIFEXITED(n->status) && WEXITSTATUS(n->status) == 0))
        fl->fs->fenced++;
    if (kc_verbose)
        say(fl, "node %c ran ticks %" PRIu64 "..%" PRIu64 " (%" PRIu64 " acks, epoch %" PRIu64 "), ended %s %d%s%s",
            'a' + n->idx, n->run.R, n->run.last_tick, n->run.acks, n->epoch,
            WIFSIGNALED(n->status) ? "by signal" : "with exit", WIFSIGNALED(n->status) ? WTERMSIG(n->status) :
            WEXITSTATUS(n->status), fault ? ", " : "", fault ? fault : "");
    kc_run_free(&n->run);
    n->exit_pending = false;
    n->run.started = false;
}

/* A standby that never took over ran to --until-tick: the reference's end. */
static void standby_end(fo_lap *fl, fo_node *n)
{
    char tail[1024];
    double ms;
    uint64_t t = 0, h = 0;
    kc_read_log(n->log, tail, sizeof tail, &ms);
    kc_run_free(&n->run);
    if (n->killed)
        return;
    if (!WIFEXITED(n->status) || WEXITSTATUS(n->status) != 0)
        kc_problem(&fl->lap, &fl->lap.st->violations, "a standby ended with %s %d: %s",
                   WIFSIGNALED(n->status) ? "signal" : "exit", WIFSIGNALED(n->status) ? WTERMSIG(n->status) :
                   WEXITSTATUS(n->status), tail);
    else if (!log_final(n->log, &t, &h) || t != fl->d->until)
        kc_problem(&fl->lap, &fl->lap.st->violations, "a standby exited 0 without a final line at tick %" PRIu64
                   ": %s", fl->d->until, tail);
    else if (h != fl->d->ref->final_hash)
        kc_problem(&fl->lap, &fl->lap.st->mismatches, "a standby followed to tick %" PRIu64 " and holds %016" PRIx64
                   ", reference %016" PRIx64, t, h, fl->d->ref->final_hash);
    else /* the stream holds the whole world (its last primary may have died at the very end) */
        fl->lap.reached_end = true;
}

/* `keel-wal verify` on a killed node's directory before it opens again
 * (as the other modes do after every crash). */
static void verify_dir(fo_lap *fl, const fo_node *n)
{
    char data[PATH_MAX + 96], out[8192];
    snprintf(data, sizeof data, "%s/data.mdb", n->dir);
    if (!fl->d->wal[0] || access(data, F_OK))
        return;
    char *argv[] = {(char *)fl->d->wal, "verify", (char *)n->dir, NULL};
    int rc = kc_capture(argv, NULL, true, out, sizeof out);
    (*fl->d->verified)++;
    if (rc == 0)
        return;
    out[strcspn(out, "\n")] = '\0';
    kc_problem(&fl->lap, &fl->lap.st->violations, "keel-wal verify %s exited with %d after the kill: %s", n->dir, rc,
               out);
}

/* Has an epoch later than n's started? Then n was deposed, even if its own
 * start line (a late promotion) was read after that epoch's. */
static bool superseded(const fo_lap *fl, const fo_node *n)
{
    for (uint32_t i = 0; i < fl->nep; i++)
        if (n->run.has_epoch && fl->ep[i].epoch > n->epoch)
            return true;
    return false;
}

/* Its pipe ended: reap it, account for it, and start it again as a standby
 * while the world goes on. */
static void node_exit(fo_lap *fl, fo_node *n)
{
    n->status = kc_proc_reap(&n->proc);
    n->up = n->stopped = false;
    if (n->killed && WIFEXITED(n->status))
        n->killed = false; /* the kill raced with its exit */
    bool clean = WIFEXITED(n->status) && WEXITSTATUS(n->status) == 0;
    n->deposed |= !n->standby && superseded(fl, n);
    if (n->standby)
        standby_end(fl, n);
    else if (n->killed || n->deposed || clean)
        finish_run(fl, n, n->killed ? "kill" : n->deposed ? "fenced" : NULL);
    else {
        n->exit_pending = true; /* it rejoins once a promotion explains the exit */
        n->pending_since = kc_now_ms();
    }
    if (n->killed)
        verify_dir(fl, n);
    if (fl->lap.reached_end && !fl->end_at)
        fl->end_at = kc_now_ms();
    if (!n->exit_pending && !fl->lap.reached_end && !fl->aborted && !kc_stop)
        node_spawn(fl, n, false);
}

/* ---- the round's fault ---------------------------------------------------------------- */

static fo_node *world_runner(fo_lap *fl)
{
    for (int i = 0; i < 2; i++) {
        fo_node *n = &fl->node[i];
        if (n->up && !n->standby && !n->deposed && n->run.started && !n->killed && !n->stopped)
            return n;
    }
    return NULL;
}

static void plan_round(fo_lap *fl)
{
    fo_node *p = world_runner(fl);
    fo_node *o = p ? &fl->node[!p->idx] : NULL;
    if (fl->plan.kind != FO_NONE || !*fl->rounds_left || !p || !o->up || !o->standby ||
        p->run.last_tick + 30 >= fl->d->until)
        return;
    bool nats_ok = nats_cluster_ready(fl->ns); /* a NATS node is killed only while all three serve */
    (*fl->rounds_left)--;
    fl->lap.st->rounds++;
    uint64_t *rng = &fl->rng, r = kc_rand(rng) % 100;
    fo_plan *pl = &fl->plan;
    *pl = (fo_plan){.target = p->idx, .trig = KC_TRIG_TICK, .n = p->run.last_tick + 1 + kc_rand(rng) % 20,
                    .nats_node = -1, .delay_ms = kc_rand(rng) % 2 ? 0 : (double)(kc_rand(rng) % 1500) / 1000};
    if (r < 30) {
        pl->kind = FO_KILL;
        if (kc_rand(rng) % 2) { /* after an acknowledgement: mid-tick, the trade on the stream */
            pl->trig = KC_TRIG_ACKS;
            pl->n = p->run.acks + 1 + kc_rand(rng) % (3 * KC_TPT);
        }
    } else if (r < 55) {
        pl->kind = FO_STOP;
    } else if (!nats_ok) {
        pl->kind = FO_KILL;
    } else if (r < 75) {
        pl->kind = FO_NATS_KILL;
        pl->nats_node = (int)(kc_rand(rng) % (uint64_t)fl->ns->n);
        pl->kill_after_ms = (double)(kc_rand(rng) % 400);
    } else {
        pl->kind = FO_NATS;
        pl->nats_node = (int)(kc_rand(rng) % (uint64_t)fl->ns->n);
    }
    say(fl, "round: %s of node %c at %s %" PRIu64 " +%.1f ms", kind_names[pl->kind], 'a' + p->idx,
        pl->trig == KC_TRIG_ACKS ? "ack" : "tick", pl->n, pl->delay_ms);
}

static void act(fo_lap *fl)
{
    fo_plan *p = &fl->plan;
    fo_node *n = &fl->node[p->target];
    double now = kc_now_ms();
    if (!n->up) { /* it ended first: the round had nothing more to break */
        plan_clear(fl);
        return;
    }
    if (p->stage == 0 && (p->kind == FO_NATS_KILL || p->kind == FO_NATS)) {
        nats_cluster_kill(fl->ns, p->nats_node);
        fl->fs->nats_kills++;
        p->resume_tick = n->run.last_tick + 15;
        p->at = now + p->kill_after_ms;
        p->stage = 1;
        p->acted_at = now;
        say(fl, "NATS node %d killed", p->nats_node);
        return;
    }
    if (p->kind == FO_STOP) {
        kill(n->proc.pid, SIGSTOP);
        n->stopped = true;
    } else {
        kill(n->proc.pid, SIGKILL);
        n->killed = true;
    }
    say(fl, "node %c %s", 'a' + n->idx, p->kind == FO_STOP ? "stopped" : "killed");
    p->stage = 2;
    p->acted_at = now;
}

/* The plan's clocks: act when due; give up when no promotion comes; bring
 * a NATS node back once the primary ran on without it. */
static void plan_timers(fo_lap *fl)
{
    fo_plan *p = &fl->plan;
    double now = kc_now_ms();
    if (p->kind == FO_NONE || !p->fired)
        return;
    if (fl->lap.reached_end && p->stage > 0) { /* the world ended: nothing is left to take over */
        plan_clear(fl);
        return;
    }
    bool nats_only = p->kind == FO_NATS;
    if ((p->stage == 0 || (p->stage == 1 && !nats_only)) && now >= p->at) {
        act(fl);
        return;
    }
    fo_node *n = &fl->node[p->target];
    if (nats_only && p->stage == 1 && (!n->up || n->run.last_tick >= p->resume_tick || fl->lap.reached_end)) {
        plan_clear(fl);
        return;
    }
    if (p->stage > 0 && now - p->acted_at > FO_PROMOTE_MS) {
        kc_problem(&fl->lap, &fl->lap.st->violations, "%s of the primary: no standby took over, and the world did "
                   "not go on, within %.0f s", kind_names[p->kind], FO_PROMOTE_MS / 1000);
        fl->aborted = true;
    }
}

/* ---- a lap ---------------------------------------------------------------------------- */

static void lap_abort(fo_lap *fl)
{
    for (int i = 0; i < 2; i++) {
        fo_node *n = &fl->node[i];
        if (!n->up)
            continue;
        if (n->stopped)
            kill(n->proc.pid, SIGCONT);
        kill(n->proc.pid, SIGKILL);
        kc_proc_reap(&n->proc);
        kc_run_free(&n->run);
        n->up = n->exit_pending = false;
    }
    fl->lap.broken = true;
}

/* A silent primary, or a standby that does not reach the end. */
static void watch(fo_lap *fl)
{
    double now = kc_now_ms();
    for (int i = 0; i < 2 && !fl->aborted; i++) {
        fo_node *n = &fl->node[i];
        if (n->exit_pending && now - n->pending_since > FO_PROMOTE_MS) {
            finish_run(fl, n, NULL); /* no takeover explains it: the oracle says what it was */
            fl->aborted = true;
        }
        if (n->up && !n->standby && !n->stopped && !n->deposed && now - n->proc.last > FO_HANG_MS) {
            kc_problem(&fl->lap, &fl->lap.st->violations, "node %c (ticks to %" PRIu64 ") went silent for %.0f s",
                       'a' + i, n->run.last_tick, FO_HANG_MS / 1000);
            fl->aborted = true;
        }
    }
    for (int i = 0; i < fl->ns->n && !fl->aborted; i++)
        if (fl->ns->starting[i] && !nats_cluster_ready(fl->ns) && fl->ns->starting[i] &&
            now - fl->ns->started_at[i] > FO_PROMOTE_MS) {
            kc_problem(&fl->lap, &fl->lap.st->violations, "NATS node %d, started again, was not healthy within "
                       "%.0f s", i, FO_PROMOTE_MS / 1000);
            fl->aborted = true;
        }
    if (!fl->aborted && fl->end_at && now - fl->end_at > FO_END_MS) {
        kc_problem(&fl->lap, &fl->lap.st->violations, "the world ended at tick %" PRIu64 ", a standby did not "
                   "follow it there within %.0f s", fl->d->until, FO_END_MS / 1000);
        fl->aborted = true;
    }
}

static void lap_loop(fo_lap *fl)
{
    while (!kc_stop && !fl->aborted && (fl->node[0].up || fl->node[1].up)) {
        plan_round(fl);
        struct pollfd pf[2];
        fo_node *who[2];
        nfds_t np = 0;
        for (int i = 0; i < 2; i++)
            if (fl->node[i].up && fl->node[i].proc.fd >= 0) {
                pf[np] = (struct pollfd){.fd = fl->node[i].proc.fd, .events = POLLIN};
                who[np++] = &fl->node[i];
            }
        int pr = poll(pf, np, 50);
        for (nfds_t k = 0; pr > 0 && k < np; k++) {
            fo_node *n = who[k];
            if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR)) || !n->up)
                continue;
            n->reading = true;
            kc_proc_read(&n->proc, on_line, n);
            n->reading = false;
        }
        for (int i = 0; i < 2; i++) /* a pipe that ended, here or in a drain */
            if (fl->node[i].up && fl->node[i].proc.fd < 0)
                node_exit(fl, &fl->node[i]);
        plan_timers(fl);
        watch(fl);
    }
    if (fl->aborted || kc_stop)
        lap_abort(fl);
}

/* Every trade acknowledged in epoch E, and every tick an IMMEDIATE node of
 * epoch E reported, is in the state each later epoch started from (the
 * oracle checks a start against the acknowledgements seen by then; these
 * may have arrived after it). */
static void check_epochs(fo_lap *fl)
{
    const kc_lap *lap = &fl->lap;
    for (uint32_t e = 0; e < fl->nep; e++) {
        const struct fo_epoch *later = &fl->ep[e];
        for (uint64_t id = 1; id <= lap->ref->ntrades; id++) {
            if (lap->acked[id] != 1 || lap->ack_epoch[id] >= later->epoch ||
                kc_trade_in_state(id, later->R, later->j))
                continue;
            fl->fs->two_primaries++;
            kc_problem(&fl->lap, &fl->lap.st->lost, "trade %" PRIu64 " (tick %" PRIu64 ") was acknowledged in epoch %"
                       PRIu64 " but epoch %" PRIu64 " started from tick %" PRIu64 " with %d trades of the next: two "
                       "primaries acknowledged", id, (id - 1) / KC_TPT, lap->ack_epoch[id], later->epoch, later->R,
                       later->j);
            fl->lap.acked[id] = 2; /* counted once */
        }
        for (uint32_t i = 0; i < fl->nep; i++)
            if (fl->ep[i].epoch < later->epoch && fl->ep[i].durable > later->R)
                kc_problem(&fl->lap, &fl->lap.st->lost, "epoch %" PRIu64 " reported tick %" PRIu64 " durable "
                           "(IMMEDIATE), but epoch %" PRIu64 " started from tick %" PRIu64, fl->ep[i].epoch,
                           fl->ep[i].durable, later->epoch, later->R);
    }
}

static void run_lap(const kc_fo_desc *d, nats_cluster *ns, kc_fo_stats *fs, uint64_t *rounds_left)
{
    fo_lap *fl = calloc(1, sizeof *fl);
    if (!fl)
        return;
    uint32_t n = ++*d->laps;
    *fl = (fo_lap){.d = d, .fs = fs, .ns = ns, .rounds_left = rounds_left,
                   .rng = kc_mix(d->seed ^ 0x666f6c6170ull ^ ((uint64_t)n << 20)), .plan.nats_node = -1};
    kc_lap_init(&fl->lap, d->ref, d->st, "failover", n);
    fl->t0 = kc_now_ms();
    if (kc_lap_epochs(&fl->lap)) {
        kc_lap_free(&fl->lap);
        free(fl);
        return;
    }
    snprintf(fl->world, sizeof fl->world, "kc%u", n);
    static const int64_t every[] = {3, 8, 20, 50, 0};
    fl->ckpt_every = every[kc_rand(&fl->rng) % 5];
    uint64_t dur = kc_rand(&fl->rng) % 4;
    fl->durability = dur < 3 ? "group" : "immediate";
    fl->workers = 1 + (int)(kc_rand(&fl->rng) % 2);
    for (int i = 0; i < 2; i++) {
        fl->node[i] = (fo_node){.fl = fl, .idx = i};
        fl->node[i].proc.pid = -1;
        snprintf(fl->node[i].dir, sizeof fl->node[i].dir, "%s/failover-%u-%c", d->work, n, 'a' + i);
    }
    say(fl, "world %s, checkpoint every %" PRId64 ", %s, %d workers", fl->world, fl->ckpt_every, fl->durability,
        fl->workers);
    double until = kc_now_ms() + FO_PROMOTE_MS; /* a lap starts on a healthy cluster */
    while (!nats_cluster_ready(ns) && kc_now_ms() < until && !kc_stop)
        nanosleep(&(struct timespec){0, 50 * 1000000L}, NULL);
    if (!nats_cluster_ready(ns))
        kc_problem(&fl->lap, &fl->lap.st->violations, "the NATS cluster was not healthy within %.0f s",
                   FO_PROMOTE_MS / 1000);
    else
        node_spawn(fl, &fl->node[0], true);
    lap_loop(fl);
    for (int i = 0; i < 2; i++)
        if (fl->node[i].exit_pending)
            finish_run(fl, &fl->node[i], NULL);
    check_epochs(fl);
    if (!fl->lap.reached_end && !fl->lap.broken && !kc_stop)
        kc_problem(&fl->lap, &fl->lap.st->violations, "the lap ended before the world reached tick %" PRIu64,
                   d->until);
    plan_clear(fl);
    if (!d->keep)
        for (int i = 0; i < 2; i++) {
            kc_rm_tree(fl->node[i].dir);
            remove(fl->node[i].log);
        }
    kc_lap_free(&fl->lap);
    free(fl);
}

bool kc_failover_run(const kc_fo_desc *d, uint64_t rounds, kc_fo_stats *out)
{
    *out = (kc_fo_stats){0};
    nats_cluster ns = {0};
    char dir[PATH_MAX + 32];
    bool ok = true;
    for (uint32_t lap = 0; rounds && !kc_stop; lap++) {
        if (lap % FO_NATS_LAPS == 0) {
            if (lap)
                nats_cluster_stop(&ns);
            if (lap && !d->keep)
                kc_rm_tree(dir);
            snprintf(dir, sizeof dir, "%s/nats-%u", d->work, lap / FO_NATS_LAPS + 1);
            if (nats_cluster_start(&ns, dir, 3, &kc_stop)) {
                fprintf(stderr, "keel-crash: failover mode: cannot start a 3-node NATS cluster (nats-server on the "
                        "PATH? logs in %s)\n", dir);
                ok = false;
                break;
            }
        }
        uint64_t before = rounds;
        run_lap(d, &ns, out, &rounds);
        if (rounds == before && rounds) /* the world ended before a fault could be placed */
            rounds--;
    }
    nats_cluster_stop(&ns);
    if (!d->keep)
        kc_rm_tree(dir);
    return ok;
}
