/*
 * keel-crash -- breaks keel-world on purpose, again and again, and checks
 * every restart against an oracle (docs/reliability.md).
 *
 *   keel-crash [--rounds N] [--seed S] [--mode kill|failpoint|powerloss|failover|all]
 *              [--workload world] [--until-tick T] [--entities N]
 *              [--world PATH] [--keep DIR] [--verbose]
 *
 * A reference run of keel-world (in memory, the same seed, uninterrupted)
 * gives the oracle (oracle.c). Then, per mode, rounds of crashes on a data
 * directory that lives for a *lap*: fresh at tick 0, crashed and restarted
 * until a child reaches --until-tick, then reopened once more and replaced by
 * a fresh one. Every child's report lines are checked as they come: the
 * state it recovered (the previous crash's result), the ticks it runs, the
 * trades it acknowledges, the economy. One round = one planned fault:
 *
 *   kill       SIGKILL chosen from the child's own reports: after the n-th
 *              ack, on the tick line of tick n (checkpoint ticks among them),
 *              at the start line (right after recovery), after the recovered
 *              state was reported (the first tick starting), at the final
 *              line (the clean close under way), or a delay after the fork
 *              (during exec, open, replay), most plus a random delay
 *   failpoint  each name of `keel-world --list-failpoints` in turn, armed in
 *              KEEL_FAILPOINTS as crash@N, eio@N or enospc@N
 *   powerloss  the LD_PRELOAD shim cuts the power at the N-th write to the
 *              directory, dropping (or tearing) what was not synced
 *   failover   a primary and a standby on a 3-node NATS cluster: kill -9,
 *              SIGSTOP/SIGCONT, NATS nodes killed (failover.c)
 *
 * Some crashes are followed at once by a second (the restart killed during or
 * right after its recovery). The schedule is a function of --seed (each
 * round draws from its own generator); the instants the OS delivers vary.
 */
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kc.h"

enum { M_KILL, M_FAILPOINT, M_POWERLOSS, M_FAILOVER, M_COUNT };
static const char *const mode_names[M_COUNT] = {"kill", "failpoint", "powerloss", "failover"};

typedef struct options {
    uint64_t rounds, seed, until;
    uint32_t entities;
    bool modes[M_COUNT];
    const char *world, *keep;
} options;

/* Everything a mode's rounds need. */
typedef struct ctx {
    const options *o;
    char world[PATH_MAX], shim[PATH_MAX], work[PATH_MAX], log[PATH_MAX + 128];
    char wal[PATH_MAX];          /* keel-wal beside keel-crash: verifies every crashed directory; "" without */
    uint64_t verified;
    const kc_ref *ref;
    char *fp_buf;                /* --list-failpoints output; names point into it */
    struct failpoint {
        const char *name;
        bool io;                 /* eio / enospc apply (keel accepts them there) */
        uint64_t max_n;          /* N is drawn in [1, max_n]: learned from whether it fired */
        uint64_t armed, fired, io_fired; /* rounds, of which it fired, of which with eio / enospc */
    } *fp;
    uint32_t nfp;
    uint64_t ref_seed;           /* the reference's world seed (KEEL_CRASH_SELFTEST=hash skews it) */
    kc_stats st[M_COUNT];
    uint32_t laps;
    double start_ms;             /* the last fork-to-start time seen: the EXEC trigger's scale */
    double writes_per_tick;      /* powerloss: tracked writes per tick, learned */
    char pl_stats[PATH_MAX + 128]; /* the shim's KEEL_POWERLOSS_STATS file */
    uint64_t pl_cuts, pl_tear, pl_bytes_undone, pl_pages_dropped, pl_pages_torn;
    kc_fo_stats fo;              /* failover mode's counters */
} ctx;

/* The lap in progress: a data directory and the oracle's view of it. */
typedef struct lap_state {
    kc_lap lap;
    char dir[PATH_MAX + 64];
    int64_t ckpt_every;
    bool open;
} lap_state;

static void usage(FILE *to)
{
    fprintf(to,
            "usage: keel-crash [--rounds N] [--seed S] [--mode kill|failpoint|powerloss|failover|all]\n"
            "                  [--workload world] [--until-tick T] [--entities N] [--world PATH]\n"
            "                  [--keep DIR] [--verbose]\n"
            "Crashes keel-world again and again and checks every restart against a reference run:\n"
            "the recovered state is a reference state (tick R, or R plus a prefix of tick R+1's\n"
            "trades covering every acknowledged one), the continued run matches the reference to\n"
            "the end, no acknowledged trade is lost, total coins and items are constant.\n"
            "  --rounds N      planned faults in all, shared among the modes (default 30)\n"
            "  --seed S        the world's seed and the schedule's (default 1)\n"
            "  --mode M        kill: SIGKILL at instants chosen from the child's reports;\n"
            "                  failpoint: every compiled-in failpoint in turn (crash, eio, enospc);\n"
            "                  powerloss: the LD_PRELOAD shim drops or tears unsynced writes;\n"
            "                  failover: a primary (--replicate sync) and a standby on a 3-node\n"
            "                  NATS cluster (nats-server on the PATH) under kill -9, SIGSTOP and\n"
            "                  NATS node kills: no acknowledged trade lost, never two primaries;\n"
            "                  all (default): the four, rounds shared\n"
            "  --workload W    the workload: world (keel-world; the only one)\n"
            "  --until-tick T  each data directory runs from tick 0 to T (default 300)\n"
            "  --entities N    agents of the world (default 5000)\n"
            "  --world PATH    keel-world to run (default: next to keel-crash)\n"
            "  --keep DIR      work in DIR and keep every data directory and child log\n"
            "  --verbose       one line per child on stderr\n"
            "Prints a table per mode and a last line\n"
            "`crashes=<N> lost_acknowledged=<n> hash_mismatches=<n> invariant_violations=<n>`.\n"
            "Exit 0 when the three counts are 0, 1 otherwise or when interrupted (SIGINT, SIGTERM),\n"
            "2 on bad arguments or when keel-world cannot be run.\n");
}

static int parse_u64(const char *flag, const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = s ? strtoull(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || s[0] == '-' || v < min || v > max) {
        fprintf(stderr, "keel-crash: %s needs a number in [%" PRIu64 ", %" PRIu64 "], got '%s'\n", flag, min, max,
                s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){.rounds = 30, .seed = 1, .until = 300, .entities = 5000};
    bool mode_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t n;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--verbose")) {
            kc_verbose = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "keel-crash: %s\n", strncmp(a, "--", 2) ? "unexpected argument" : "a flag needs a value");
            usage(stderr);
            return -1;
        }
        i++;
        if (!strcmp(a, "--rounds")) {
            if (parse_u64(a, v, 1, 10000000, &o->rounds))
                return -1;
        } else if (!strcmp(a, "--seed")) {
            if (parse_u64(a, v, 0, UINT64_MAX, &o->seed))
                return -1;
        } else if (!strcmp(a, "--until-tick")) {
            if (parse_u64(a, v, 10, 1000000, &o->until))
                return -1;
        } else if (!strcmp(a, "--entities")) {
            if (parse_u64(a, v, 0, 50000000, &n))
                return -1;
            o->entities = (uint32_t)n;
        } else if (!strcmp(a, "--mode")) {
            bool all = !strcmp(v, "all"), ok = all;
            for (int m = 0; m < M_COUNT; m++)
                if (all || !strcmp(v, mode_names[m]))
                    o->modes[m] = ok = true;
            if (!ok || mode_given) {
                fprintf(stderr, "keel-crash: --mode needs one of kill, failpoint, powerloss, failover, all; got '%s'%s\n", v,
                        mode_given ? " (given twice)" : "");
                return -1;
            }
            mode_given = true;
        } else if (!strcmp(a, "--workload")) {
            if (strcmp(v, "world")) {
                fprintf(stderr, "keel-crash: --workload: the only workload is 'world', got '%s'\n", v);
                return -1;
            }
        } else if (!strcmp(a, "--world") || !strcmp(a, "--keep")) {
            if (!*v) {
                fprintf(stderr, "keel-crash: %s needs a path\n", a);
                return -1;
            }
            *(a[2] == 'w' ? &o->world : &o->keep) = v;
        } else {
            fprintf(stderr, "keel-crash: unknown argument '%s'\n", a);
            usage(stderr);
            return -1;
        }
    }
    if (!mode_given)
        for (int m = 0; m < M_COUNT; m++)
            o->modes[m] = true;
    return 0;
}

/* ---- set-up --------------------------------------------------------------------------- */

/* Is there an executable `name` in a directory of $PATH? */
static bool on_path(const char *name)
{
    const char *path = getenv("PATH");
    char dir[PATH_MAX + 64];
    for (const char *p = path ? path : ""; *p;) {
        size_t n = strcspn(p, ":");
        snprintf(dir, sizeof dir, "%.*s/%s", (int)(n < PATH_MAX ? n : PATH_MAX), p, name);
        if (n && access(dir, X_OK) == 0)
            return true;
        p += n + (p[n] == ':');
    }
    return false;
}

/* `name` in the directory keel-crash runs from (/proc/self/exe), or in `beside`'s. */
static bool find_beside(const char *name, const char *beside, char *out, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    const char *dirs[2] = {NULL, beside};
    if (n > 0) {
        self[n] = '\0';
        dirs[0] = self;
    }
    for (int i = 0; i < 2; i++) {
        if (!dirs[i])
            continue;
        const char *slash = strrchr(dirs[i], '/');
        int len = slash ? (int)(slash - dirs[i]) : 1;
        snprintf(out, cap, "%.*s/%s", len, slash ? dirs[i] : ".", name);
        if (access(out, X_OK) == 0 || (access(out, R_OK) == 0 && strstr(name, ".so")))
            return true;
    }
    return false;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void kc_rm_tree(const char *path)
{
    nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Does keel accept `action` at failpoint `name`? keel-world arms it with
 * --failpoints for a hit that never comes and runs one tick in memory: exit 0
 * when the spec is accepted, 2 when keel refuses it (its other arguments are
 * fixed and valid). */
static int failpoint_accepts(const ctx *c, const char *name, const char *action, bool *yes)
{
    char spec[256], out[4096];
    snprintf(spec, sizeof spec, "%.160s=%s@1000000000", name, action);
    char *argv[] = {(char *)c->world, "--memory", "--until-tick", "1", "--entities", "0", "--quiet",
                    "--failpoints", spec, NULL};
    int rc = kc_capture(argv, NULL, true, out, sizeof out);
    *yes = rc == 0;
    if (rc != 0 && rc != 2) {
        fprintf(stderr, "keel-crash: probing failpoint %s: keel-world exited with %d: %s\n", name, rc, out);
        return rc;
    }
    return 0;
}

/* `keel-world --list-failpoints`: one name per line (a first word per line
 * is taken, should the list grow columns). Each is probed for eio. */
static int load_failpoints(ctx *c)
{
    c->fp_buf = malloc(1 << 16);
    if (!c->fp_buf)
        return -1;
    char *argv[] = {c->world, "--list-failpoints", NULL};
    int rc = kc_capture(argv, NULL, false, c->fp_buf, 1 << 16); /* the names only: a note goes to stderr */
    if (rc != 0) {
        fprintf(stderr, "keel-crash: `%s --list-failpoints` failed (exit %d): failpoint mode needs a keel-world "
                "built with failpoints\n", c->world, rc);
        return -1;
    }
    uint32_t cap = 0;
    for (char *save = NULL, *tok = strtok_r(c->fp_buf, "\n", &save); tok; tok = strtok_r(NULL, "\n", &save)) {
        tok[strcspn(tok, " \t")] = '\0';
        if (!*tok)
            continue;
        if (c->nfp == cap) {
            cap = cap ? cap * 2 : 32;
            struct failpoint *n = realloc(c->fp, cap * sizeof *n);
            if (!n)
                return -1;
            c->fp = n;
        }
        c->fp[c->nfp++] = (struct failpoint){.name = tok, .max_n = 4};
    }
    if (!c->nfp) {
        fprintf(stderr, "keel-crash: `%s --list-failpoints` lists none (built with -DKEEL_FAILPOINTS=OFF?)\n",
                c->world);
        return -1;
    }
    for (uint32_t i = 0; i < c->nfp; i++) {
        bool crash_ok;
        if (failpoint_accepts(c, c->fp[i].name, "crash", &crash_ok) ||
            failpoint_accepts(c, c->fp[i].name, "eio", &c->fp[i].io))
            return -1;
        if (!crash_ok) {
            fprintf(stderr, "keel-crash: keel-world refuses KEEL_FAILPOINTS=%s=crash (failpoints compiled out?)\n",
                    c->fp[i].name);
            return -1;
        }
    }
    /* a seeded order, so a short run does not always try the same few first */
    uint64_t rng = kc_mix(c->o->seed ^ 0x6670u);
    for (uint32_t i = c->nfp; i > 1; i--) {
        uint32_t k = (uint32_t)(kc_rand(&rng) % i);
        struct failpoint t = c->fp[i - 1];
        c->fp[i - 1] = c->fp[k];
        c->fp[k] = t;
    }
    return 0;
}

static kc_spec base_spec(const ctx *c, const char *data)
{
    return (kc_spec){.world = c->world, .data = data, .seed = c->o->seed, .until = c->o->until,
                     .entities = c->o->entities, .workers = 1, .log = c->log, .hang_ms = 120000};
}

/* Does the shim work in keel-world? A one-tick run on a scratch directory
 * with the shim preloaded and no cut must leave its statistics with tracked
 * writes. It does not in a sanitizer build (the sanitizer's runtime must come
 * first; its interceptors bypass the shim): then powerloss mode would test
 * nothing, and says so instead. */
static int probe_powerloss(const ctx *c)
{
    char dir[PATH_MAX + 32], stats[PATH_MAX + 64], env[4][PATH_MAX + 96];
    snprintf(dir, sizeof dir, "%s/probe", c->work);
    snprintf(stats, sizeof stats, "%s/probe.stats", c->work);
    snprintf(env[0], sizeof env[0], "LD_PRELOAD=%s", c->shim);
    snprintf(env[1], sizeof env[1], "KEEL_POWERLOSS_DIR=%s", dir);
    snprintf(env[2], sizeof env[2], "KEEL_POWERLOSS_STATS=%s", stats);
    snprintf(env[3], sizeof env[3], "KEEL_POWERLOSS_CUT=0");
    kc_spec s = base_spec(c, dir);
    s.until = 1;
    s.entities = 0;
    s.log = NULL;
    for (int i = 0; i < 4; i++)
        s.env[i] = env[i];
    kc_exit ex;
    int rc = kc_child_run(&s, NULL, NULL, &ex);
    FILE *f = fopen(stats, "r");
    unsigned long long writes = 0;
    bool ok = !rc && f && fscanf(f, "writes=%llu", &writes) == 1 && writes > 0;
    if (f)
        fclose(f);
    remove(stats);
    kc_rm_tree(dir);
    if (!ok)
        fprintf(stderr, "keel-crash: the power-loss shim %s does not act in %s (no statistics after a run: a "
                "sanitizer build?); powerloss mode cannot run\n", c->shim, c->world);
    return ok ? 0 : -1;
}

void kc_read_log(const char *path, char *tail, size_t cap, double *rec_ms)
{
    *rec_ms = -1;
    snprintf(tail, cap, "(no output)");
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (!line[0])
            continue;
        double ms;
        unsigned long long t;
        if (sscanf(line, "recovered tick=%llu in %lf ms", &t, &ms) == 2)
            *rec_ms = ms;
        snprintf(tail, cap, "%s", line);
    }
    fclose(f);
}

/* ---- one child ------------------------------------------------------------------------ */

static const char *trig_name(kc_trig_kind k)
{
    static const char *const n[] = {"none", "exec+delay", "start", "state", "tick", "acks", "final"};
    return n[k];
}

/* The shim's counters after a powerloss child: the cut happened where it
 * died (nothing else killed it), what it undid, and the writes per tick, so
 * that later cut points land inside the run. */
static void powerloss_account(ctx *c, kc_lap *lap, const kc_exit *ex, uint64_t ticks)
{
    FILE *f = fopen(c->pl_stats, "r");
    unsigned long long writes = 0, cut = 0, undone = 0, dropped = 0, torn = 0;
    char mode[8] = "";
    int n = f ? fscanf(f, "writes=%llu syncs=%*u cut=%llu mode=%7s seed=%*u bytes_journaled=%*u bytes_undone=%llu "
                       "pages_dropped=%llu pages_torn=%llu", &writes, &cut, mode, &undone, &dropped, &torn) : 0;
    if (f)
        fclose(f);
    remove(c->pl_stats);
    bool died = WIFSIGNALED(ex->status) && !ex->killed;
    if (n != 6) {
        if (died)
            kc_problem(lap, &lap->st->violations, "a powerloss child died by signal %d and the shim wrote no "
                       "statistics (%s)", WTERMSIG(ex->status), c->pl_stats);
        return;
    }
    if (died && !cut)
        kc_problem(lap, &lap->st->violations, "a powerloss child died by signal %d, but the shim did not cut",
                   WTERMSIG(ex->status));
    if (cut) {
        c->pl_cuts++;
        c->pl_tear += !strcmp(mode, "tear");
        c->pl_bytes_undone += undone;
        c->pl_pages_dropped += dropped;
        c->pl_pages_torn += torn;
    }
    if (ticks > 0)
        c->writes_per_tick = 0.7 * c->writes_per_tick + 0.3 * ((double)(cut ? cut : writes) / (double)ticks);
}

/* `keel-wal verify` on the directory a crash left, before anything opens it
 * again: an independent reader of the on-disk format (CRCs, LSN continuity,
 * units closed by their markers, checkpoint consistency) must find it sound.
 * "Cannot be opened" counts only once a child had opened the directory. */
static void verify_dir(ctx *c, lap_state *ls)
{
    char data[PATH_MAX + 96], out[8192];
    snprintf(data, sizeof data, "%s/data.mdb", ls->dir);
    if (!c->wal[0] || access(data, F_OK))
        return;
    char *argv[] = {c->wal, "verify", ls->dir, NULL};
    int rc = kc_capture(argv, NULL, true, out, sizeof out);
    c->verified++;
    if (rc == 0 || (rc == 2 && !ls->lap.openable))
        return;
    out[strcspn(out, "\n")] = '\0';
    kc_problem(&ls->lap, &ls->lap.st->violations, "keel-wal verify %s exited with %d after the crash: %s", ls->dir, rc,
               out);
}

/* Run one child on the lap's directory and account for it. Returns whether
 * it crashed (or failed as injected). cut: the powerloss cut, 0 without. */
static bool run_child(ctx *c, lap_state *ls, kc_spec *s, const char *fault, uint64_t cut, const char *what,
                      bool *ours)
{
    kc_lap *lap = &ls->lap;
    if (c->o->keep)
        snprintf(c->log, sizeof c->log, "%s-%u.log", ls->dir, lap->child + 1);
    kc_run run;
    kc_run_init(&run, lap, s->durability && !strcmp(s->durability, "immediate"));
    kc_exit ex;
    if (kc_child_run(s, kc_run_line, &run, &ex)) {
        kc_problem(lap, &lap->st->violations, "cannot start keel-world: %s", strerror(errno));
        kc_run_free(&run);
        return false;
    }
    char tail[1024];
    double rec_ms;
    kc_read_log(c->log, tail, sizeof tail, &rec_ms);
    if (ex.start_ms > 0)
        c->start_ms = ex.start_ms;
    bool crashed = kc_run_end(&run, &ex, ex.killed ? "kill" : fault, rec_ms, tail);
    if (kc_verbose) {
        char st[64];
        if (WIFSIGNALED(ex.status))
            snprintf(st, sizeof st, "signal %d%s", WTERMSIG(ex.status), ex.killed ? " (ours)" : "");
        else
            snprintf(st, sizeof st, "exit %d", WEXITSTATUS(ex.status));
        fprintf(stderr, "[%s lap %u child %u] %s (trigger %s n=%" PRIu64 " +%uus, workers %d, ckpt %" PRId64 ", %s%s): ",
                lap->mode, lap->lap, lap->child, what, trig_name(s->trig.kind), s->trig.n, s->trig.delay_us,
                s->workers, s->ckpt_every, s->durability ? s->durability : "group", s->wal_retain ? ", wal-retain" : "");
        if (run.started && run.fresh)
            fprintf(stderr, "fresh, ");
        else if (run.started)
            fprintf(stderr, "recovered tick %" PRIu64 " +%d trades in %.1f ms, ", run.R, run.j, rec_ms);
        else
            fprintf(stderr, "no start line, ");
        fprintf(stderr, "%" PRIu64 " ticks to %" PRIu64 ", %" PRIu64 " acks, %s%s\n", run.ticks, run.last_tick,
                run.acks, st, crashed ? ", crashed" : "");
    }
    if (cut)
        powerloss_account(c, lap, &ex, run.ticks);
    kc_run_free(&run);
    if (ours)
        *ours = ex.killed;
    if (crashed)
        verify_dir(c, ls);
    return crashed;
}

/* ---- laps ----------------------------------------------------------------------------- */

static void lap_begin(ctx *c, lap_state *ls, int mode, kc_stats *st)
{
    uint32_t n = ++c->laps;
    snprintf(ls->dir, sizeof ls->dir, "%s/%s-%u", c->work, mode_names[mode], n);
    kc_lap_init(&ls->lap, c->ref, st, mode_names[mode], n);
    uint64_t rng = kc_mix(c->o->seed ^ 0x6c6170u ^ ((uint64_t)n << 20));
    /* checkpoints: every tick (a crash is then always near one), often, now
     * and then, never (a long WAL to replay, with kills during the replay) */
    static const int64_t every[] = {1, 3, 3, 8, 8, 20, 50, 0};
    ls->ckpt_every = every[kc_rand(&rng) % (sizeof every / sizeof every[0])];
    ls->open = true;
}

/* A child with the lap's settings and its own: workers, durability, WAL retention. */
static kc_spec lap_spec(ctx *c, lap_state *ls, uint64_t *rng)
{
    kc_spec s = base_spec(c, ls->dir);
    s.ckpt_every = ls->ckpt_every;
    s.workers = 1 + (int)(kc_rand(rng) % 2);
    uint64_t d = kc_rand(rng) % 10;
    s.durability = d < 7 ? "group" : d < 9 ? "immediate" : "deferred";
    s.wal_retain = kc_rand(rng) % 5 == 0;
    return s;
}

/* Run the lap's directory to --until-tick without a fault, reopen it once
 * more (a clean close loses nothing), then drop it. */
static void lap_end(ctx *c, lap_state *ls)
{
    if (!ls->open)
        return;
    uint64_t rng = kc_mix(c->o->seed ^ 0x656e64u ^ ls->lap.lap);
    for (int pass = 0; pass < 2 && !kc_stop && !ls->lap.broken; pass++) {
        if (pass == 0 && ls->lap.reached_end)
            continue;
        kc_spec s = lap_spec(c, ls, &rng);
        run_child(c, ls, &s, NULL, 0, pass ? "reopen" : "run to the end", NULL);
        if (pass == 0 && !ls->lap.reached_end)
            break; /* already reported */
    }
    if (!c->o->keep)
        kc_rm_tree(ls->dir);
    kc_lap_free(&ls->lap);
    ls->open = false;
}

/* ---- the schedule --------------------------------------------------------------------- */

/* A tick ahead of the directory's position, inside the lap. */
static uint64_t tick_ahead(const ctx *c, const kc_lap *lap, uint64_t *rng, uint64_t spread)
{
    uint64_t t = lap->pos + 1 + kc_rand(rng) % spread;
    return t < c->o->until ? t : c->o->until - 1;
}

/* Kill mode: where to SIGKILL. */
static kc_trigger plan_kill(const ctx *c, const lap_state *ls, uint64_t *rng)
{
    const kc_lap *lap = &ls->lap;
    uint64_t r = kc_rand(rng) % 100;
    uint32_t jitter = kc_rand(rng) % 2 ? 0 : (uint32_t)(kc_rand(rng) % 1500);
    if (r < 18) /* after the n-th acknowledged trade: mid-tick, trades durable, the tick not */
        return (kc_trigger){KC_TRIG_ACKS, 1 + kc_rand(rng) % (4 * KC_TPT), jitter};
    if (r < 38 && ls->ckpt_every > 0) { /* on a checkpoint tick: the checkpoint runs behind it */
        uint64_t e = (uint64_t)ls->ckpt_every, t = tick_ahead(c, lap, rng, 20);
        t += (e - t % e) % e;
        return (kc_trigger){KC_TRIG_TICK, t < c->o->until ? t : c->o->until - 1, (uint32_t)(kc_rand(rng) % 4000)};
    }
    if (r < 63)
        return (kc_trigger){KC_TRIG_TICK, tick_ahead(c, lap, rng, 30), jitter};
    if (r < 71) /* right after recovery */
        return (kc_trigger){KC_TRIG_START, 0, 0};
    if (r < 86) /* during exec, open, replay: a fraction of the last fork-to-start time */
        return (kc_trigger){KC_TRIG_EXEC, 0, (uint32_t)(kc_rand(rng) % (uint64_t)(c->start_ms * 1300 + 1))};
    if (r < 96) /* the recovered state reported, the first tick starting */
        return (kc_trigger){KC_TRIG_STATE, 0, (uint32_t)(kc_rand(rng) % 800)};
    /* at the end: the clean close (on_shutdown, the last syncs) under way */
    return (kc_trigger){KC_TRIG_FINAL, 0, (uint32_t)(kc_rand(rng) % 2000)};
}

/* Failpoint mode: the r-th round arms the next name, crash at points that
 * guard no I/O; crash / eio / crash / enospc in turn at the others (shifted
 * every pass over the names). The hit N is drawn in [1, max_n]. A recovery
 * point cannot fire on a fresh directory: there it trades places with the
 * next name in the order. If the point has not fired 40 to 80 ticks on, the
 * child is killed (a kill round then, and the point aims lower next time). */
static struct failpoint *plan_failpoint(ctx *c, const lap_state *ls, uint64_t r, uint64_t *rng, kc_spec *s,
                                        char *spec, size_t cap, const char **fault)
{
    static const char *const actions[] = {"crash", "eio", "crash", "enospc"};
    uint32_t i = (uint32_t)(r % c->nfp);
    for (uint32_t k = 1; ls->lap.child == 0 && k < c->nfp && !strncmp(c->fp[i].name, "recover.", 8); k++) {
        uint32_t other = (uint32_t)((r + k) % c->nfp);
        struct failpoint t = c->fp[i];
        c->fp[i] = c->fp[other];
        c->fp[other] = t;
    }
    struct failpoint *fp = &c->fp[i];
    const char *act = fp->io ? actions[(r + r / c->nfp) % 4] : "crash";
    snprintf(spec, cap, "KEEL_FAILPOINTS=%s=%s@%" PRIu64, fp->name, act, 1 + kc_rand(rng) % fp->max_n);
    *fault = strcmp(act, "crash") ? "eio" : "crash";
    s->env[0] = spec;
    s->trig = (kc_trigger){KC_TRIG_TICK, tick_ahead(c, &ls->lap, rng, 1) + 39 + kc_rand(rng) % 41, 0};
    return fp;
}

/* A point that did not fire in its child's run is hit fewer times than N
 * there: aim lower next time; one that fired may be hit more often: aim higher. */
static void failpoint_learn(struct failpoint *fp, bool fired, const char *fault)
{
    fp->armed++;
    fp->fired += fired;
    fp->io_fired += fired && !strcmp(fault, "eio");
    if (fired)
        fp->max_n = fp->max_n < 2048 ? fp->max_n * 2 : fp->max_n;
    else
        fp->max_n = fp->max_n > 4 ? fp->max_n / 4 : 1;
}

/* Powerloss mode: the cut at a write some ticks ahead; on a fresh directory,
 * one time in three among its first writes (the directory being created). */
static uint64_t plan_powerloss(ctx *c, const lap_state *ls, uint64_t *rng, char env[5][PATH_MAX + 160])
{
    uint64_t ticks = 1 + kc_rand(rng) % 30;
    double wpt = c->writes_per_tick > 0.5 ? c->writes_per_tick : 0.5;
    uint64_t cut = 1 + (uint64_t)((double)ticks * wpt) + kc_rand(rng) % 4;
    if (ls->lap.child == 0 && kc_rand(rng) % 3 == 0)
        cut = 1 + kc_rand(rng) % 6;
    snprintf(env[0], sizeof env[0], "KEEL_POWERLOSS_DIR=%s", ls->dir);
    snprintf(env[1], sizeof env[1], "KEEL_POWERLOSS_CUT=%" PRIu64, cut);
    snprintf(env[2], sizeof env[2], "KEEL_POWERLOSS_MODE=%s", kc_rand(rng) % 2 ? "tear" : "drop");
    snprintf(env[3], sizeof env[3], "KEEL_POWERLOSS_SEED=%" PRIu64, kc_rand(rng) % 1000000007u);
    snprintf(env[4], sizeof env[4], "KEEL_POWERLOSS_STATS=%s", c->pl_stats);
    return cut;
}

static void run_mode(ctx *c, int mode, uint64_t rounds)
{
    kc_stats *st = &c->st[mode];
    if (mode == M_FAILOVER) {
        kc_fo_desc d = {.world = c->world, .work = c->work, .wal = c->wal, .verified = &c->verified,
                        .ref = c->ref, .st = st, .seed = c->o->seed,
                        .until = c->o->until, .entities = c->o->entities, .keep = c->o->keep != NULL,
                        .laps = &c->laps};
        if (!kc_failover_run(&d, rounds, &c->fo))
            st->violations++; /* NATS could not be started: nothing was tested */
        return;
    }
    lap_state ls = {0};
    char preload[PATH_MAX + 16], fpspec[512], plenv[5][PATH_MAX + 160], what[96];
    snprintf(preload, sizeof preload, "LD_PRELOAD=%s", c->shim);
    for (uint64_t r = 0; r < rounds && !kc_stop; r++) {
        uint64_t rng = kc_mix(c->o->seed ^ kc_mix(((uint64_t)mode << 40) ^ r));
        if (ls.open && (ls.lap.reached_end || ls.lap.broken || ls.lap.pos + 3 >= c->o->until))
            lap_end(c, &ls);
        if (!ls.open)
            lap_begin(c, &ls, mode, st);
        st->rounds++;
        kc_spec s = lap_spec(c, &ls, &rng);
        const char *fault = NULL;
        uint64_t cut = 0;
        struct failpoint *fp = NULL;
        if (mode == M_KILL) {
            s.trig = plan_kill(c, &ls, &rng);
        } else if (mode == M_FAILPOINT) {
            fp = plan_failpoint(c, &ls, r, &rng, &s, fpspec, sizeof fpspec, &fault);
        } else {
            cut = plan_powerloss(c, &ls, &rng, plenv);
            s.env[0] = preload;
            for (int i = 0; i < 5; i++)
                s.env[1 + i] = plenv[i];
            fault = "powerloss";
        }
        if (mode == M_FAILPOINT)
            snprintf(what, sizeof what, "%.63s", fpspec + strlen("KEEL_FAILPOINTS="));
        else if (mode == M_POWERLOSS)
            snprintf(what, sizeof what, "cut@%" PRIu64 " %.4s", cut, plenv[2] + strlen("KEEL_POWERLOSS_MODE="));
        else
            snprintf(what, sizeof what, "kill");
        bool ours = false;
        bool crashed = run_child(c, &ls, &s, fault, cut, what, &ours);
        if (fp)
            failpoint_learn(fp, crashed && !ours, fault);
        /* now and then the restart is crashed at once, during or right after its recovery */
        if (crashed && !kc_stop && kc_rand(&rng) % 5 == 0) {
            kc_spec s2 = lap_spec(c, &ls, &rng);
            s2.trig = kc_rand(&rng) % 2 ? (kc_trigger){KC_TRIG_START, 0, 0}
                                        : (kc_trigger){KC_TRIG_EXEC, 0,
                                                       (uint32_t)(kc_rand(&rng) % (uint64_t)(c->start_ms * 1000 + 1))};
            run_child(c, &ls, &s2, NULL, 0, "second crash", NULL);
        }
    }
    lap_end(c, &ls);
}

/* ---- the table ------------------------------------------------------------------------ */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void table_row(const char *name, kc_stats *s)
{
    char ticks[48] = "-";
    if (s->nrticks) {
        qsort(s->rticks, s->nrticks, sizeof *s->rticks, cmp_u64);
        snprintf(ticks, sizeof ticks, "%" PRIu64 "/%" PRIu64 "/%" PRIu64, s->rticks[0], s->rticks[s->nrticks / 2],
                 s->rticks[s->nrticks - 1]);
    }
    char ms[24] = "-";
    if (s->rec_ms_n)
        snprintf(ms, sizeof ms, "%.1f", s->rec_ms_sum / (double)s->rec_ms_n);
    printf("%-10s %7" PRIu64 " %8" PRIu64 " %10" PRIu64 " %9" PRIu64 "  %-16s %5" PRIu64 " %11" PRIu64 " %11" PRIu64
           " %12s\n", name, s->rounds, s->crashes, s->recoveries, s->mid_tick, ticks, s->lost, s->mismatches,
           s->violations, ms);
}

/* The table; false when the oracle found anything. */
static bool print_table(ctx *c)
{
    printf("%-10s %7s %8s %10s %9s  %-16s %5s %11s %11s %12s\n", "mode", "rounds", "crashes", "recoveries", "mid-tick",
           "recovered tick", "lost", "mismatches", "violations", "recovery ms");
    printf("%-10s %7s %8s %10s %9s  %-16s %5s %11s %11s %12s\n", "", "", "", "", "", "min/median/max", "acked",
           "of hashes", "invariants", "(mean)");
    kc_stats all = {0};
    for (int m = 0; m < M_COUNT; m++) {
        kc_stats *s = &c->st[m];
        if (!c->o->modes[m])
            continue;
        table_row(mode_names[m], s);
        all.rounds += s->rounds;
        all.crashes += s->crashes;
        all.recoveries += s->recoveries;
        all.mid_tick += s->mid_tick;
        all.lost += s->lost;
        all.mismatches += s->mismatches;
        all.violations += s->violations;
        all.rec_ms_sum += s->rec_ms_sum;
        all.rec_ms_n += s->rec_ms_n;
        for (uint64_t i = 0; i < s->nrticks; i++) {
            if (all.nrticks == all.caprticks) {
                all.caprticks = all.caprticks ? all.caprticks * 2 : 256;
                uint64_t *n = realloc(all.rticks, all.caprticks * sizeof *n);
                if (!n)
                    break;
                all.rticks = n;
            }
            all.rticks[all.nrticks++] = s->rticks[i];
        }
    }
    table_row("all", &all);
    printf("crashes=%" PRIu64 " lost_acknowledged=%" PRIu64 " hash_mismatches=%" PRIu64 " invariant_violations=%" PRIu64
           "\n", all.crashes, all.lost, all.mismatches, all.violations);
    free(all.rticks);
    fflush(stdout);
    return !all.lost && !all.mismatches && !all.violations;
}

static void on_signal(int sig)
{
    (void)sig;
    kc_stop = 1;
}

int main(int argc, char **argv)
{
    options o;
    if (parse_args(argc, argv, &o))
        return 2;
    static ctx c;
    c.o = &o;
    c.start_ms = 30;
    c.writes_per_tick = 6;
    if (o.world) {
        if (!realpath(o.world, c.world) || access(c.world, X_OK)) {
            fprintf(stderr, "keel-crash: --world %s: not an executable\n", o.world);
            return 2;
        }
    } else if (!find_beside("keel-world", NULL, c.world, sizeof c.world)) {
        fprintf(stderr, "keel-crash: no keel-world next to keel-crash (%s); give --world PATH\n", c.world);
        return 2;
    }
    /* in the build tree the shim sits beside the tools; installed, in libexec/keel (KEEL_CRASH_SHIM_DIR,
     * relative to bin/), since bin/ holds programs only */
    if (o.modes[M_POWERLOSS] && !find_beside("libkeel_powerloss.so", c.world, c.shim, sizeof c.shim) &&
        !find_beside(KEEL_CRASH_SHIM_DIR "/libkeel_powerloss.so", NULL, c.shim, sizeof c.shim)) {
        fprintf(stderr, "keel-crash: powerloss mode needs libkeel_powerloss.so next to keel-crash or keel-world, "
                "or in " KEEL_CRASH_SHIM_DIR " from keel-crash's directory (target keel_powerloss)\n");
        return 2;
    }
    if (o.modes[M_FAILPOINT] && load_failpoints(&c))
        return 2;
    if (o.modes[M_FAILOVER] && !on_path("nats-server")) {
        fprintf(stderr, "keel-crash: failover mode needs nats-server on the PATH (Debian package nats-server)\n");
        return 2;
    }
    if (o.keep) {
        if (mkdir(o.keep, 0755) && errno != EEXIST) {
            fprintf(stderr, "keel-crash: --keep %s: %s\n", o.keep, strerror(errno));
            return 2;
        }
        if (!realpath(o.keep, c.work))
            return 2;
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(c.work, sizeof c.work, "%s/keel-crash-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(c.work)) {
            fprintf(stderr, "keel-crash: cannot create a work directory %s: %s\n", c.work, strerror(errno));
            return 2;
        }
    }
    if (!find_beside("keel-wal", NULL, c.wal, sizeof c.wal))
        c.wal[0] = '\0';
    snprintf(c.log, sizeof c.log, "%s/child.log", c.work);
    if (o.modes[M_POWERLOSS] && probe_powerloss(&c)) {
        if (!o.keep)
            kc_rm_tree(c.work);
        return 2;
    }
    snprintf(c.pl_stats, sizeof c.pl_stats, "%s/powerloss.stats", c.work);
    struct sigaction sa = {.sa_handler = on_signal}; /* no SA_RESTART: poll returns EINTR */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* the reference: the same seed, uninterrupted, in memory */
    const char *self = getenv("KEEL_CRASH_SELFTEST");
    c.ref_seed = o.seed + (self && !strcmp(self, "hash") ? 1 : 0);
    kc_spec rs = base_spec(&c, NULL);
    rs.seed = c.ref_seed;
    rs.prefix = true;
    static kc_ref ref;
    char why[512];
    double t0 = kc_now_ms();
    if (kc_ref_build(&ref, &rs, why, sizeof why)) {
        char tail[1024];
        double ms;
        kc_read_log(c.log, tail, sizeof tail, &ms);
        fprintf(stderr, "keel-crash: %s; its last output: %s\n", why, tail);
        if (!o.keep)
            kc_rm_tree(c.work);
        return 2;
    }
    c.ref = &ref;
    printf("keel-crash: keel-world seed %" PRIu64 ", %u entities, ticks 0..%" PRIu64 " (reference %.1f s, %" PRId64
           " coins, %" PRIu64 " items in %" PRIu64 " accounts); %" PRIu64 " rounds%s%s%s%s%s\n", o.seed, o.entities,
           o.until, (kc_now_ms() - t0) / 1e3, ref.money, ref.items, ref.accounts, o.rounds,
           o.modes[M_KILL] ? " kill" : "", o.modes[M_FAILPOINT] ? " failpoint" : "",
           o.modes[M_POWERLOSS] ? " powerloss" : "", o.modes[M_FAILOVER] ? " failover" : "", self ? " (KEEL_CRASH_SELFTEST: the oracle must fail)" : "");
    if (o.modes[M_FAILPOINT]) {
        uint32_t io = 0;
        for (uint32_t i = 0; i < c.nfp; i++)
            io += c.fp[i].io;
        printf("keel-crash: %u failpoints (%u at I/O: crash, eio, enospc; the others: crash)\n", c.nfp, io);
    }
    fflush(stdout);

    int nmodes = o.modes[M_KILL] + o.modes[M_FAILPOINT] + o.modes[M_POWERLOSS] + o.modes[M_FAILOVER], k = 0;
    for (int m = 0; m < M_COUNT && !kc_stop; m++) {
        if (!o.modes[m])
            continue;
        uint64_t share = o.rounds / (uint64_t)nmodes + ((uint64_t)k++ < o.rounds % (uint64_t)nmodes);
        run_mode(&c, m, share);
    }
    printf("keel-crash: %.1f s%s; keel-wal verify ran on %" PRIu64 " crashed directories%s\n",
           (kc_now_ms() - t0) / 1e3, kc_stop ? ", interrupted" : "", c.verified,
           c.wal[0] ? "" : " (no keel-wal beside keel-crash)");
    if (o.modes[M_POWERLOSS] && c.pl_cuts)
        printf("keel-crash: powerloss: %" PRIu64 " cuts (%" PRIu64 " drop, %" PRIu64 " tear) undid %.1f MiB of unsynced "
               "writes, %" PRIu64 " pages dropped, %" PRIu64 " torn\n", c.pl_cuts, c.pl_cuts - c.pl_tear, c.pl_tear,
               (double)c.pl_bytes_undone / 1048576.0, c.pl_pages_dropped, c.pl_pages_torn);
    if (o.modes[M_FAILOVER]) {
        const kc_fo_stats *f = &c.fo;
        printf("keel-crash: failover: %" PRIu64 " promotions (%" PRIu64 " after kill -9, %" PRIu64 " after SIGSTOP, %"
               PRIu64 " unplanned), %" PRIu64 " primaries fenced, %" PRIu64 " NATS nodes killed, %" PRIu64
               " rejoins, two_primaries=%" PRIu64 "\n", f->promotions, f->after_kill, f->after_stop, f->unplanned,
               f->fenced, f->nats_kills, f->rejoins, f->two_primaries);
    }
    if (o.modes[M_FAILPOINT]) {
        printf("keel-crash: failpoints fired/armed (of which eio or enospc):");
        for (uint32_t i = 0; i < c.nfp; i++) {
            printf(" %s %" PRIu64 "/%" PRIu64, c.fp[i].name, c.fp[i].fired, c.fp[i].armed);
            if (c.fp[i].io)
                printf(" (%" PRIu64 ")", c.fp[i].io_fired);
        }
        putchar('\n');
    }
    bool bad = !print_table(&c); /* its last line is the summary */
    for (int m = 0; m < M_COUNT; m++)
        free(c.st[m].rticks);
    kc_ref_free(&ref);
    free(c.fp);
    free(c.fp_buf);
    if (!o.keep)
        kc_rm_tree(c.work);
    return bad || kc_stop ? 1 : 0;
}
