/*
 * keel-world -- the demo world server (the README's `make run`): the world
 * of world.c on a durable runtime, a command line, a live status line, and
 * a clean stop on Ctrl-C. docs/demo.md walks through it.
 *
 * With --data (default ./keel-data) the world is durable: a restart
 * recovers it and continues to --until-tick; with the same seed it ends in
 * the hash an uninterrupted run ends in, whenever the earlier run was
 * killed. Ctrl-C (SIGINT) or SIGTERM ends the run after the current tick:
 * the runtime is closed cleanly (on_shutdown runs, everything acknowledged
 * is on disk) after a final checkpoint, so the next start is quick.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "metrics_http.h"
#include "world.h"

typedef struct options {
    uint64_t seed;
    uint32_t entities;
    uint64_t until_tick;
    int32_t workers;
    double tick_rate;
    const char *trace;
    const char *data;
    const char *metrics;        /* --metrics HOST:PORT */
    const char *failpoints;     /* --failpoints SPEC */
    bool memory;                /* --memory: no data directory */
    bool data_given, seed_given, entities_given; /* said on the command line, not defaults */
    bool until_given;
    bool forever;
    bool wal_retain;
    keel_durability durability;
    int64_t checkpoint_every;
    uint64_t live_trades;
    int report_fd;
    bool report_prefix;
    int quiet;
    /* replication (docs/replication.md) */
    const char *nats;           /* --nats URL[,URL...] */
    const char *world;          /* --world NAME */
    keel_repl_mode replicate;   /* --replicate async|sync: a primary */
    bool standby, follow;       /* --standby, --follow */
    uint64_t lease_ms;          /* --lease-ms N */
    int64_t retain_records;     /* --retain-records N (0: the library's default) */
} options;

static void usage(FILE *to)
{
    fprintf(to,
            "usage: keel-world [--data DIR | --memory] [--seed S] [--entities N]\n"
            "                  [--until-tick N | --forever] [--workers N] [--tick-rate HZ]\n"
            "                  [--durability MODE] [--checkpoint-every N] [--wal-retain]\n"
            "                  [--live-trades R] [--trace FILE] [--metrics HOST:PORT] [--quiet]\n"
            "                  [--nats URLS --world NAME (--replicate async|sync | --standby |\n"
            "                   --follow) [--lease-ms N] [--retain-records N]]\n"
            "  --data DIR      data directory (default ./keel-data): the world is recovered\n"
            "                  from it at start and written to it as it runs\n"
            "  --memory        no data directory: the world lives in memory only\n"
            "  --seed S        seed of the world's generator (default 1): the world is a pure\n"
            "                  function of the seed and the tick\n"
            "  --entities N    agents of a new world (default 100000)\n"
            "                  A directory records the --seed and --entities of its world\n"
            "                  (world.params); a run giving others is refused: use a fresh\n"
            "                  --data DIR for a new world\n"
            "  --until-tick N  run until the world's tick counter reaches N (absolute, so a\n"
            "                  restarted run stops at the same tick); default: 600 more ticks\n"
            "  --forever       run until Ctrl-C (SIGINT) or SIGTERM\n"
            "  --durability M  immediate|group|deferred: when a tick counts as durable\n"
            "                  (default group; trades are always immediate)\n"
            "  --checkpoint-every N  checkpoint every N ticks (default 600; 0 = never)\n"
            "  --wal-retain    keep WAL records after checkpoints, so `keel-wal replay`\n"
            "                  reaches back to tick 0 (the directory then only grows)\n"
            "  --workers N     threads running systems, -1 = one per CPU (default -1)\n"
            "  --tick-rate HZ  ticks per second, 0 = as fast as they run (default 60)\n"
            "  --live-trades R a network-like thread also submits R trades/s (keel_submit,\n"
            "                  IMMEDIATE); the run is then no longer a function of the seed\n"
            "  --trace FILE    write a Chrome trace-event JSON of the last ticks at exit\n"
            "  --metrics HOST:PORT  serve Prometheus metrics at http://HOST:PORT/metrics while\n"
            "                  the world runs (port 0: any free port; the line `metrics\n"
            "                  http://ADDR:PORT/metrics` names it)\n"
            "  --nats URLS     NATS servers (nats://HOST:PORT, comma-separated) holding the\n"
            "                  world's replicated WAL (docs/replication.md)\n"
            "  --world NAME    the replicated world's name (stream KEEL_<NAME>)\n"
            "  --replicate M   async|sync: run as the world's primary and publish its WAL;\n"
            "                  sync acknowledges only what the stream holds\n"
            "  --standby       follow the primary; take over when its lease lapses (prints\n"
            "                  `promoted epoch=<E> tick=<T>`) and continue as primary (sync)\n"
            "  --follow        a read replica: follow, never take over; with --until-tick N\n"
            "                  stop once tick N is applied\n"
            "  --lease-ms N    the primary's lease time (default 5000)\n"
            "  --retain-records N  a primary keeps N WAL records on the stream before its\n"
            "                  latest published checkpoint and purges the rest (default\n"
            "                  100000)\n"
            "  --quiet         no status line; the recovery and final lines always print\n"
            "  --report-fd FD  write the report protocol (docs/demo.md) to FD: used by\n"
            "                  keel-crash; the run then steps one tick at a time (a\n"
            "                  standby reports from its takeover on)\n"
            "  --report-prefix with --report-fd: also the hash after every trade\n"
            "  --list-failpoints  print the failpoints compiled in, one per line\n"
            "                  (arm them with KEEL_FAILPOINTS, docs/testing.md)\n"
            "  --failpoints SPEC  arm failpoints as KEEL_FAILPOINTS does, but a spec keel\n"
            "                  refuses is an error (exit 2), not a warning\n"
            "On a terminal the status is one line kept up to date; otherwise a line every\n"
            "5 seconds. A restart prints `recovered tick=<T> in <ms> ms`; the last line is\n"
            "`final tick=<N> hash=<16 hex digits>`.\n");
}

/* A decimal in [0, max], the whole string; -1 (nothing printed) otherwise. */
static int parse_num(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = s ? strtoull(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v > max || s[0] == '-')
        return -1;
    *out = v;
    return 0;
}

static int parse_u64(const char *flag, const char *s, uint64_t max, uint64_t *out)
{
    if (parse_num(s, max, out)) {
        fprintf(stderr, "keel-world: %s needs a number in [0, %" PRIu64 "], got '%s'\n", flag, max, s ? s : "");
        return -1;
    }
    return 0;
}

static int parse_durability(const char *v, keel_durability *out)
{
    static const char *const modes[] = {"immediate", "group", "deferred"};
    for (int m = 0; m < 3; m++)
        if (v && !strcmp(v, modes[m])) {
            *out = (keel_durability)(m + 1);
            return 0;
        }
    fprintf(stderr, "keel-world: --durability needs immediate, group or deferred, got '%s'\n", v ? v : "");
    return -1;
}

static int parse_workers(const char *v, int32_t *out)
{
    uint64_t n;
    if (v && !strcmp(v, "-1")) {
        *out = -1;
        return 0;
    }
    if (parse_num(v, 64, &n) || n == 0) { /* one message: the range of this flag, not parse_u64's */
        fprintf(stderr, "keel-world: --workers needs -1 or a number in [1, 64], got '%s'\n", v ? v : "");
        return -1;
    }
    *out = (int32_t)n;
    return 0;
}

static int list_failpoints(void)
{
    if (!keel_failpoints_compiled())
        fprintf(stderr, "keel-world: built with KEEL_FAILPOINTS=OFF: no failpoints\n");
    for (size_t i = 0; keel_failpoint_name(i); i++)
        printf("%s\n", keel_failpoint_name(i));
    return 0;
}

/* Flags without a value; 1 when `a` was one of them. */
static int parse_flag(const char *a, options *o)
{
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
        usage(stdout);
        exit(0);
    } else if (!strcmp(a, "--list-failpoints")) {
        exit(list_failpoints());
    }
    bool *flags[] = {&o->memory, &o->forever, &o->wal_retain, &o->report_prefix};
    const char *names[] = {"--memory", "--forever", "--wal-retain", "--report-prefix"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strcmp(a, names[i])) {
            *flags[i] = true;
            return 1;
        }
    if (!strcmp(a, "--quiet")) {
        o->quiet = 1;
        return 1;
    }
    if (!strcmp(a, "--standby") || !strcmp(a, "--follow")) {
        *(a[2] == 's' ? &o->standby : &o->follow) = true;
        return 1;
    }
    return 0;
}

/* Flags with a value v; 0 on success, -1 on a bad value or flag. */
static int parse_valued(const char *a, const char *v, options *o)
{
    uint64_t n;
    if (!strcmp(a, "--durability"))
        return parse_durability(v, &o->durability);
    if (!strcmp(a, "--workers"))
        return parse_workers(v, &o->workers);
    if (!strcmp(a, "--seed")) {
        o->seed_given = true;
        return parse_u64(a, v, UINT64_MAX, &o->seed);
    }
    if (!strcmp(a, "--live-trades"))
        return parse_u64(a, v, 1000000, &o->live_trades);
    if (!strcmp(a, "--until-tick")) {
        o->until_given = true;
        return parse_u64(a, v, UINT64_MAX, &o->until_tick);
    }
    if (!strcmp(a, "--checkpoint-every") || !strcmp(a, "--entities") || !strcmp(a, "--tick-rate") ||
        !strcmp(a, "--report-fd")) {
        uint64_t max = a[2] == 'c' ? INT64_MAX : a[2] == 'e' ? 50000000 : a[2] == 't' ? 100000 : 1024;
        if (parse_u64(a, v, max, &n))
            return -1;
        if (a[2] == 'c')
            o->checkpoint_every = n ? (int64_t)n : -1;
        else if (a[2] == 'e')
            o->entities = (uint32_t)n, o->entities_given = true;
        else if (a[2] == 't')
            o->tick_rate = (double)n;
        else
            o->report_fd = (int)n;
        return 0;
    }
    if (!strcmp(a, "--failpoints")) { /* armed (or refused) by validate */
        if (!v || !*v) {
            fprintf(stderr, "keel-world: --failpoints needs a spec (docs/testing.md)\n");
            return -1;
        }
        o->failpoints = v;
        return 0;
    }
    if (!strcmp(a, "--replicate")) {
        o->replicate = v && !strcmp(v, "sync") ? KEEL_REPL_SYNC : v && !strcmp(v, "async") ? KEEL_REPL_ASYNC
                                                                                            : KEEL_REPL_OFF;
        if (o->replicate == KEEL_REPL_OFF)
            fprintf(stderr, "keel-world: --replicate '%s' is not async or sync\n", v ? v : "");
        return o->replicate == KEEL_REPL_OFF ? -1 : 0;
    }
    if (!strcmp(a, "--lease-ms"))
        return parse_u64(a, v, 3600000, &o->lease_ms) || o->lease_ms < 100
                   ? (fprintf(stderr, "keel-world: --lease-ms must be in [100, 3600000]\n"), -1) : 0;
    if (!strcmp(a, "--retain-records")) {
        uint64_t keep = 0;
        if (parse_u64(a, v, INT64_MAX, &keep) || !keep)
            return fprintf(stderr, "keel-world: --retain-records must be at least 1\n"), -1;
        o->retain_records = (int64_t)keep;
        return 0;
    }
    if (!strcmp(a, "--nats") || !strcmp(a, "--world")) {
        if (!v || !*v) {
            fprintf(stderr, "keel-world: %s needs a value\n", a);
            return -1;
        }
        *(a[2] == 'n' ? &o->nats : &o->world) = v;
        return 0;
    }
    if (!strcmp(a, "--metrics")) { /* checked when main listens, before anything starts */
        o->metrics = v ? v : "";
        return 0;
    }
    if (!strcmp(a, "--data") || !strcmp(a, "--trace")) {
        if (!v || !*v) {
            fprintf(stderr, "keel-world: %s needs a path\n", a);
            return -1;
        }
        *(a[2] == 'd' ? &o->data : &o->trace) = v;
        o->data_given |= a[2] == 'd';
        return 0;
    }
    fprintf(stderr, "keel-world: unknown argument '%s' (keel-world --help lists the options)\n", a);
    return -1;
}

/* The replication flags: one role, with its NATS servers and world name,
 * on a data directory. */
static int validate_replication(const options *o)
{
    int bad = 0, roles = (o->replicate != KEEL_REPL_OFF) + o->standby + o->follow;
    if (roles > 1)
        bad = fprintf(stderr, "keel-world: --replicate, --standby and --follow exclude each other: a node has one "
                              "role\n");
    if (roles && (!o->nats || !o->world))
        bad = fprintf(stderr, "keel-world: %s needs --nats URLS and --world NAME\n",
                      o->replicate ? "--replicate" : o->standby ? "--standby" : "--follow");
    if (!roles && (o->nats || o->world || o->lease_ms || o->retain_records))
        bad = fprintf(stderr, "keel-world: --nats, --world, --lease-ms and --retain-records need a role: "
                              "--replicate async|sync, --standby or --follow\n");
    if (roles && o->memory)
        bad = fprintf(stderr, "keel-world: replication needs a data directory: leave --memory out\n");
    if (o->follow && (o->live_trades || o->report_fd >= 0))
        bad = fprintf(stderr, "keel-world: a follower does not run the world: --live-trades and --report-fd need "
                              "a primary or a standby\n");
    if (o->standby && o->live_trades)
        bad = fprintf(stderr, "keel-world: a standby does not run the world until it takes over: --live-trades "
                              "needs a primary\n");
    return bad ? -1 : 0;
}

/* Everything the command line alone decides, before anything starts: flags
 * that contradict each other, and the resources options name. One message
 * per problem; -1 when there was one. */
static int validate(const options *o)
{
    int bad = 0;
    if (o->memory && o->data_given)
        bad = fprintf(stderr, "keel-world: --memory and --data exclude each other: --memory runs without a data "
                              "directory\n");
    if (o->forever && o->until_given)
        bad = fprintf(stderr, "keel-world: --forever and --until-tick exclude each other\n");
    if (o->report_prefix && o->report_fd < 0)
        bad = fprintf(stderr, "keel-world: --report-prefix needs --report-fd FD (it adds lines to that report)\n");
    if (o->report_fd >= 0 && fcntl(o->report_fd, F_GETFD) < 0)
        bad = fprintf(stderr, "keel-world: --report-fd %d: descriptor %d is not open\n", o->report_fd, o->report_fd);
    bad |= validate_replication(o);
    if (o->failpoints && keel_failpoints_set(o->failpoints))
        bad = fprintf(stderr, "keel-world: --failpoints: %s\n", keel_last_error());
    return bad ? -1 : 0;
}

/* --trace FILE, created at the start and written at exit: a run never ends
 * on a path that cannot take it. Created last of everything the options
 * check (main), so a run refused for anything else leaves no file behind.
 * -1 with one line printed when it cannot be. */
static int trace_create(const options *o)
{
    if (!o->trace)
        return 0;
    int fd = open(o->trace, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return fprintf(stderr, "keel-world: --trace %s: cannot create it: %s\n", o->trace, strerror(errno)), -1;
    close(fd);
    return 0;
}

static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){.seed = 1, .entities = 100000, .until_tick = 600, .workers = -1, .tick_rate = 60,
                   .data = "keel-data", .checkpoint_every = 600, .report_fd = -1};
    int bad = 0;
    for (int i = 1; i < argc; i++) { /* on to the end: every bad option says so, once */
        if (parse_flag(argv[i], o))
            continue;
        bad |= parse_valued(argv[i], i + 1 < argc ? argv[i + 1] : NULL, o);
        i++;
    }
    return bad ? -1 : validate(o);
}

static int check(int rc, const char *what)
{
    if (rc)
        fprintf(stderr, "keel-world: %s: %s: %s\n", what, keel_strerror(rc), keel_last_error());
    return rc;
}

/* PlayerShedding (docs/overload.md): a real server would now refuse logins
 * and disconnect idle players; the demo has no connections to drop, so it
 * says so, once per entry into the level. */
static void shed_players(keel_runtime *rt, uint64_t tick, void *user)
{
    (void)rt;
    (void)user;
    fprintf(stderr, "keel-world: critical overload at tick %" PRIu64 ": a game server would shed players now\n", tick);
}

/* The world already in o->data: its recorded parameters stand for the
 * flags not given, and a flag giving another value is refused (world.params,
 * params.c). 0; 2 on a contradiction; 1 when the record is unreadable. */
static int match_params(options *o, bool *recorded)
{
    world_params p;
    int rc = params_read(o->data, &p);
    *recorded = rc == 1;
    if (rc <= 0)
        return rc ? 1 : 0;
    int bad = 0;
    if (o->seed_given && o->seed != p.seed)
        bad = fprintf(stderr, "keel-world: --seed %" PRIu64 " contradicts the world in %s, created with --seed %" PRIu64
                      ": a data directory holds one world. Leave --seed out to continue it, or give a fresh "
                      "--data DIR to start a new world\n", o->seed, o->data, p.seed);
    if (o->entities_given && o->entities != p.entities)
        bad = fprintf(stderr, "keel-world: --entities %u contradicts the world in %s, created with --entities %u: a "
                      "data directory holds one world. Leave --entities out to continue it, or give a fresh "
                      "--data DIR to start a new world\n", o->entities, o->data, p.entities);
    o->seed = p.seed;
    o->entities = p.entities;
    return bad ? 2 : 0;
}

/* Record the parameters of the world just opened in o->data, once the
 * runtime owns the directory (so two starts cannot race on the record). */
static int record_params(const options *o, const keel_recovery *r)
{
    if (!r->fresh) /* a world made before keel-world kept the record: the flags of this run describe it */
        fprintf(stderr, "keel-world: %s has no world.params: recording --seed %" PRIu64 " --entities %u for its "
                "world\n", o->data, o->seed, o->entities);
    return params_write(o->data, &(world_params){.seed = o->seed, .entities = o->entities});
}

/* The report's `start` line and the state it starts from: after recovery,
 * or when a standby takes over (a recovery on another machine). A
 * replicated node names its epoch: acknowledgements belong to it. */
static int report_start(world_app *app, bool fresh, bool replicated)
{
    if (app->report_fd < 0)
        return 0;
    keel_repl_status rp;
    keel_repl_status_get(app->rt, &rp);
    char epoch[32] = "";
    if (replicated)
        snprintf(epoch, sizeof epoch, " epoch=%" PRIu64, rp.epoch);
    report_line(app, "start fresh=%d tick=%" PRIu64 " hash=%016" PRIx64 "%s", fresh ? 1 : 0,
                keel_runtime_tick(app->rt), keel_world_hash(app->w), epoch);
    return check(report_state(app), "reading the accounts");
}

static int setup(world_app *app, keel_schedule **sched, const options *o, keel_recovery *out)
{
    app->seed = o->seed;
    app->initial_entities = o->entities;
    app->report_fd = o->standby ? -1 : o->report_fd; /* a standby reports from its promotion on */
    app->report_prefix = o->report_prefix;
    keel_runtime_desc desc = {
        .workers = o->workers,
        .tick_rate_hz = o->tick_rate > 0 ? o->tick_rate : -1,
        .on_first_tick = world_first_tick,
        .hook_user = app,
        .overload = {.on_critical_overload = shed_players, .user = app},
        .durability = o->durability,
        .durable = {.dir = o->memory ? NULL : o->data, .checkpoint_every_ticks = o->checkpoint_every,
                    .wal_retain = o->wal_retain, .on_shutdown = world_shutdown, .shutdown_arg = app},
        .replication = {.nats = o->nats, .world = o->world, .mode = o->replicate, .lease_ms = (int32_t)o->lease_ms,
                        .role = o->standby ? KEEL_ROLE_STANDBY : o->follow ? KEEL_ROLE_FOLLOWER : KEEL_ROLE_PRIMARY,
                        .stop_tick = o->until_given ? o->until_tick : 0, .retain_records = o->retain_records},
    };
    int rc = check(keel_runtime_create(&desc, &app->rt), "creating the runtime");
    if (rc) /* the descriptor is the flags': one it refuses is a bad option (exit 2), before anything started */
        return rc == KEEL_EINVAL ? 2 : -1;
    app->w = keel_runtime_world(app->rt);
    if (world_register(app) || check(keel_schedule_create(app->rt, sched), "creating the schedule") ||
        world_add_systems(app, *sched))
        return -1;
    if (check(keel_runtime_set_schedule(app->rt, *sched), "installing the schedule"))
        return -1;
    keel_recovery r = {.fresh = true};
    if (!o->memory && check(keel_runtime_recover(app->rt, &r), "opening the data directory"))
        return -1;
    *out = r;
    if (!r.fresh) /* printed under --quiet too: scripts look for it */
        printf("recovered tick=%" PRIu64 " in %.1f ms (checkpoint tick %" PRIu64 ", %" PRIu64 " WAL records, "
               "%" PRIu64 " side transactions)\n",
               r.tick, (double)r.ns / 1e6, r.checkpoint_tick, r.records, r.side_txns);
    fflush(stdout);
    return report_start(app, r.fresh, o->nats != NULL);
}

/* ---- the status line --------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct status_line {
    bool tty;            /* stdout is a terminal: one line, rewritten */
    bool durable;        /* a data directory: the WAL fields exist */
    bool replicated;     /* --nats: the role field exists */
    double every;        /* seconds between updates */
    double last_t;       /* when the last update was printed */
    uint64_t last_tick, last_trades;
} status_line;

/* The terminal's width; set to 0 by SIGWINCH (the signal thread), measured
 * again before the next line. */
static _Atomic int term_cols;

static int terminal_cols(void)
{
    int c = atomic_load(&term_cols);
    if (c)
        return c;
    struct winsize ws;
    c = ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col ? ws.ws_col : 80;
    atomic_store(&term_cols, c);
    return c;
}

/* The fields, in display order. */
enum { F_TICK, F_TPS, F_ENTITIES, F_TRADES, F_TICK_MS, F_WAL_MB, F_WAL_RATIO, F_LAG, F_LEVEL, F_REPL, F_CELL, F_COUNT };

/* On a narrow terminal fields are dropped from the end of this list: the
 * tick and how fast it goes first, the overload level next, then what the
 * world holds, and the WAL's volume and the busiest cell last. */
static const int keep_order[F_COUNT] = {F_TICK, F_TPS, F_REPL, F_TICK_MS, F_LEVEL, F_LAG, F_ENTITIES, F_TRADES,
                                        F_WAL_MB, F_WAL_RATIO, F_CELL};

/* Join the fields that fit into width columns (all when width is 0), in
 * display order, separated by spaces. */
static void status_fit(char f[F_COUNT][48], int width, char *out, size_t cap)
{
    bool keep[F_COUNT] = {false};
    int used = -1;
    for (int i = 0; i < F_COUNT; i++) {
        int k = keep_order[i], len = (int)strlen(f[k]);
        if (len && (!width || used + 1 + len <= width)) {
            keep[k] = true;
            used += 1 + len;
        }
    }
    size_t n = 0;
    out[0] = 0;
    for (int k = 0; k < F_COUNT && n < cap; k++)
        if (keep[k])
            n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? " " : "", f[k]);
}

static void status_print(world_app *app, status_line *st, uint64_t tick)
{
    double t = now_s(), dt = t - st->last_t;
    if (dt < st->every)
        return;
    keel_tick_record rec = {0};
    keel_telemetry_tick(app->rt, tick, &rec);
    keel_runtime_stats rs;
    keel_runtime_stats_get(app->rt, &rs);
    uint64_t trades = atomic_load(&app->trades) + atomic_load(&app->refused);
    uint64_t busiest = atomic_load(&app->busiest_cell);
    char f[F_COUNT][48] = {{0}}, line[F_COUNT * 48];
    snprintf(f[F_TICK], 48, "tick=%" PRIu64, tick);
    snprintf(f[F_TPS], 48, "tps=%.1f", (double)(tick - st->last_tick) / dt);
    snprintf(f[F_ENTITIES], 48, "entities=%u", rec.entities);
    snprintf(f[F_TRADES], 48, "trades/s=%.0f", (double)(trades - st->last_trades) / dt);
    snprintf(f[F_TICK_MS], 48, "tick_ms=%.2f", (double)rec.actual_ns / 1e6);
    if (st->durable) { /* without a data directory there is no WAL to describe */
        snprintf(f[F_WAL_MB], 48, "wal_mb=%.1f", (double)rs.wal_bytes / 1e6);
        snprintf(f[F_WAL_RATIO], 48, "wal_ratio=%.2f",
                 rec.wal_stored_bytes ? (double)rec.wal_raw_bytes / (double)rec.wal_stored_bytes : 0);
        snprintf(f[F_LAG], 48, "durable_lag=%" PRIu64, rec.durable_lag);
    }
    snprintf(f[F_LEVEL], 48, "level=%s x%u", keel_overload_level_name((keel_overload_level)rec.overload_level),
             rec.multiplier ? rec.multiplier : 1);
    keel_repl_status rp;
    keel_repl_status_get(app->rt, &rp);
    if (st->replicated) /* the role, its epoch and how far behind the stream (or the primary's publishing) is */
        snprintf(f[F_REPL], 48, "%s%s epoch=%" PRIu64 " repl_lag=%" PRIu64 "r/%" PRIu64 "t",
                 rp.fenced ? "fenced " : rp.degraded ? "degraded " : "", keel_repl_role_name(rp.role), rp.epoch,
                 rp.lag_records, rp.lag_ticks);
    snprintf(f[F_CELL], 48, "busiest_cell=%" PRIu64 ":%" PRIu64, busiest >> 32, busiest & 0xffffffffu);
    /* a terminal's last column would wrap the line on some terminals: one less */
    status_fit(f, st->tty ? terminal_cols() - 1 : 0, line, sizeof line);
    if (st->tty)
        printf("\r%s\033[K", line);
    else
        printf("%s\n", line);
    fflush(stdout);
    st->last_t = t;
    st->last_tick = tick;
    st->last_trades = trades;
}

/* ---- signals: Ctrl-C ends the run after the current tick ---------------- */

static _Atomic bool stop_requested;

static void handled_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGWINCH);
}

/* A thread waits for SIGINT/SIGTERM (blocked in every other thread, so
 * it is the one that takes them) and asks the runtime to stop: no work in
 * a signal handler, where the runtime's locks are off limits. SIGWINCH
 * (the terminal was resized) only has the status line measure again. */
static void *signal_thread(void *arg)
{
    world_app *app = arg;
    sigset_t set;
    handled_signals(&set);
    int sig;
    while (sigwait(&set, &sig) == 0) {
        if (sig == SIGWINCH) {
            atomic_store(&term_cols, 0);
            continue;
        }
        atomic_store(&stop_requested, true);
        keel_runtime_stop(app->rt);
        break;
    }
    return NULL;
}

static void block_stop_signals(void)
{
    sigset_t set;
    handled_signals(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

/* ---- the run ----------------------------------------------------------- */

static int start_live_trades(world_app *app, const options *o, pthread_t *th)
{
    /* the players exist after the first tick */
    if (keel_runtime_tick(app->rt) == 0 && check(keel_runtime_step(app->rt), "running the first tick"))
        return -1;
    keel_iter it;
    keel_query_iter(app->players, &it);
    while (keel_iter_next(&it))
        for (uint32_t i = 0; i < it.count && app->nwho < PLAYERS; i++)
            app->who[app->nwho++] = it.entities[i];
    app->live_rate = o->live_trades;
    return app->nwho >= 2 && pthread_create(th, NULL, world_live_thread, app) == 0 ? 1 : 0;
}

static void stop_live_trades(world_app *app, pthread_t th, int *status, int quiet)
{
    atomic_store(&app->live_stop, true);
    /* the thread may wait on the tickets of its last batch: tick until it ends */
    while (pthread_tryjoin_np(th, NULL) != 0)
        if (keel_runtime_step(app->rt) && !*status)
            *status = check(-1, "running ticks while the trade thread finishes") ? 1 : 0;
    if (!quiet)
        printf("live trades: %" PRIu64 " done, %" PRIu64 " refused or failed\n", atomic_load(&app->live_done),
               atomic_load(&app->live_failed));
}

/* Run ticks until the end tick or a stop request. Report mode steps one
 * tick at a time and reports each tick's hash; otherwise ticks run in
 * batches short enough for the status line and for Ctrl-C. */
static int run_ticks(world_app *app, const options *o, uint64_t until)
{
    status_line st = {.tty = isatty(STDOUT_FILENO) == 1, .durable = !o->memory, .replicated = o->nats != NULL,
                      .last_t = now_s(), .last_tick = keel_runtime_tick(app->rt)};
    st.every = st.tty ? 0.25 : 5.0;
    uint64_t batch = o->report_fd >= 0 ? 1 : o->tick_rate > 0 ? (uint64_t)(o->tick_rate / 10) + 1 : 16;
    while (!atomic_load(&stop_requested) && keel_runtime_tick(app->rt) < until) {
        uint64_t left = until - keel_runtime_tick(app->rt);
        if (check(keel_runtime_run(app->rt, left < batch ? left : batch), "running ticks")) {
            if (keel_runtime_fatal(app->rt) == KEEL_EFENCED)
                fprintf(stderr, "keel-world: fenced: another primary took world '%s' over; this node acknowledges "
                                "nothing more\n", o->world);
            return 1;
        }
        uint64_t t = keel_runtime_tick(app->rt);
        if (app->report_fd >= 0) /* the hash reads every row: only when someone listens */
            report_line(app, "tick t=%" PRIu64 " hash=%016" PRIx64, t, keel_world_hash(app->w));
        if (!o->quiet)
            status_print(app, &st, t);
    }
    if (st.tty && !o->quiet)
        printf("\n");
    return 0;
}

/* A standby or follower: apply the stream until tick `until`; a standby
 * that takes over says so and runs the rest of the ticks as primary. */
static int run_replica(world_app *app, const options *o, uint64_t until)
{
    status_line st = {.tty = isatty(STDOUT_FILENO) == 1, .durable = true, .replicated = true, .last_t = now_s(),
                      .last_tick = keel_runtime_tick(app->rt)};
    st.every = st.tty ? 0.25 : 5.0;
    bool said = false;
    while (!atomic_load(&stop_requested) && keel_runtime_tick(app->rt) < until) {
        bool promoted = false;
        int rc = keel_replica_poll(app->rt, 200, &promoted);
        if (rc == KEEL_EUNAVAILABLE) { /* NATS out of reach: say so once, keep trying */
            if (!said)
                check(rc, "following the stream (retrying)");
            said = true;
            continue;
        }
        if (check(rc, "following the stream"))
            return 1;
        said = false;
        if (promoted) { /* printed under --quiet too: scripts look for it */
            keel_repl_status rp;
            keel_repl_status_get(app->rt, &rp);
            printf("%spromoted epoch=%" PRIu64 " tick=%" PRIu64 "\n", st.tty && !o->quiet ? "\n" : "", rp.epoch,
                   keel_runtime_tick(app->rt));
            fflush(stdout);
            app->report_fd = o->report_fd;
            if (report_start(app, false, true))
                return 1;
            return run_ticks(app, o, until);
        }
        if (!o->quiet)
            status_print(app, &st, keel_runtime_tick(app->rt));
    }
    if (st.tty && !o->quiet)
        printf("\n");
    return 0;
}

/* The end of a run: the economy and the TRANSIENT grid must hold. */
static int final_checks(world_app *app)
{
    economy ec;
    if (check(world_economy(app, &ec), "reading the accounts"))
        return 1;
    if (ec.money != world_start_money() || ec.items != world_start_items() || ec.dups) {
        fprintf(stderr, "keel-world: economy broken: %" PRId64 " coins (expected %" PRId64 "), %u items (expected %u), "
                "%u held twice\n", ec.money, world_start_money(), ec.items, world_start_items(), ec.dups);
        return 1;
    }
    uint64_t stale = atomic_load(&app->grid_mismatches);
    if (stale) {
        fprintf(stderr, "keel-world: %" PRIu64 " agents found a stale grid cell (on_first_tick did not rebuild it)\n",
                stale);
        return 1;
    }
    return 0;
}

/* Destroy the queries and close the runtime: close's result (a failed final
 * flush means the last ticks are not durable). */
static int world_release(world_app *app)
{
    keel_query_destroy(app->players);
    keel_query_destroy(app->merchants);
    keel_query_destroy(app->agents);
    return keel_runtime_close(app->rt);
}

int main(int argc, char **argv)
{
    options o;
    if (parse_args(argc, argv, &o))
        return 2;
    bool recorded = false;
    /* a standby or read replica takes its world from the stream: the schema checks its parameters at the
       open (docs/demo.md), and the record is written again from the flags the open accepted */
    bool replica = o.standby || o.follow;
    int status = o.memory || replica ? 0 : match_params(&o, &recorded);
    if (status)
        return status;
    char bound[160];
    int metrics_fd = o.metrics ? metrics_listen(o.metrics, bound, sizeof bound) : -1;
    if (o.metrics && metrics_fd < 0)
        return 2;
    if (trace_create(&o)) {
        if (metrics_fd >= 0)
            close(metrics_fd);
        return 2;
    }
    if (o.metrics) /* printed under --quiet too: with port 0 it names the port */
        printf("metrics http://%s/metrics\n", bound);
    block_stop_signals(); /* before any thread starts: they all inherit the mask */
    world_app app = {.report_fd = -1};
    keel_schedule *sched = NULL;
    keel_recovery rec = {.fresh = true};
    status = setup(&app, &sched, &o, &rec);
    status = status == 2 ? 2 : status ? 1 : 0;
    if (!status && !o.memory && (replica ? params_write(o.data, &(world_params){.seed = o.seed,
                                                                               .entities = o.entities})
                                         : !recorded && record_params(&o, &rec)))
        status = 1;
    if (!status && o.until_given && o.until_tick < keel_runtime_tick(app.rt)) {
        /* exit 2, no final line: the tick asked for cannot be reached, and its hash is not this world's */
        fprintf(stderr, "keel-world: the world in %s is at tick %" PRIu64 ", past --until-tick %" PRIu64 ": a world "
                "does not go back (keel-wal replay %s --to-tick %" PRIu64 " rebuilds that tick's state)\n", o.data,
                keel_runtime_tick(app.rt), o.until_tick, o.data, o.until_tick);
        if (metrics_fd >= 0)
            close(metrics_fd);
        keel_schedule_destroy(sched);
        world_release(&app);
        return 2;
    }
    metrics_http *metrics = NULL;
    if (metrics_fd >= 0 && status)
        close(metrics_fd);
    else if (metrics_fd >= 0 && !(metrics = metrics_serve(metrics_fd, app.rt)))
        status = 1;
    pthread_t sig_th, live_th;
    bool sig_on = !status && pthread_create(&sig_th, NULL, signal_thread, &app) == 0;
    uint64_t until = o.forever || ((o.standby || o.follow) && !o.until_given) ? UINT64_MAX : o.until_given ? o.until_tick : keel_runtime_tick(app.rt) + 600;
    app.start_tick = status ? 0 : keel_runtime_tick(app.rt);
    int live_on = !status && o.live_trades ? start_live_trades(&app, &o, &live_th) : 0;
    status = status ? status : live_on < 0 ? 1 : o.standby || o.follow ? run_replica(&app, &o, until) : run_ticks(&app, &o, until);
    if (live_on > 0)
        stop_live_trades(&app, live_th, &status, o.quiet);
    if (app.rt)
        world_settle_all(&app, !status); /* the last trades' acknowledgements come before `final` */
    if (!status)
        status = final_checks(&app);
    if (!status && atomic_load(&stop_requested) && !o.memory)
        status = check(keel_checkpoint(app.rt), "writing the final checkpoint") ? 1 : 0;
    if (!status) {
        report_state(&app);
        uint64_t t = keel_runtime_tick(app.rt), h = keel_world_hash(app.w);
        report_line(&app, "final tick=%" PRIu64 " hash=%016" PRIx64, t, h);
        printf("final tick=%" PRIu64 " hash=%016" PRIx64 "\n", t, h);
        fflush(stdout);
    }
    /* after `final`: the world's result stands whatever happens to the trace */
    if (!status && o.trace)
        status = check(keel_trace_export(app.rt, o.trace), "writing the trace") ? 1 : 0;
    if (sig_on) {
        pthread_kill(sig_th, SIGTERM); /* ends its sigwait if no signal came; rt is still open */
        pthread_join(sig_th, NULL);
    }
    metrics_stop(metrics); /* the last scrape ends before the runtime closes */
    keel_schedule_destroy(sched); /* a no-op once installed: the runtime owns it */
    if (check(world_release(&app), "closing the runtime")) /* the final flush failed: not durable */
        status = 1;
    return status;
}
