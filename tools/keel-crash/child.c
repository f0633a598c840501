/*
 * child.c -- one keel-world child: fork + exec (so an LD_PRELOAD shim and
 * KEEL_FAILPOINTS reach it as they would a server), its report lines read
 * from a pipe on fd 3, and the SIGKILL at the instant the trigger names.
 *
 * A kill is decided from what the child has reported (after the n-th ack,
 * the tick line of tick n, the start line) plus an optional delay measured
 * from that line; the pipe is drained meanwhile, so every line the child
 * wrote before it died is seen, in order, and checked.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kc.h"

extern char **environ;

volatile int kc_stop;

#define KC_REPORT_FD 3

/* Variables the parent's environment must not pass on: the faults are
 * keel-crash's to choose (a stray KEEL_FAILPOINTS would crash the reference). */
static bool child_env_drop(const char *entry, const kc_spec *s)
{
    static const char *const ours[] = {"KEEL_FAILPOINTS=", "KEEL_POWERLOSS_", "LD_PRELOAD=", "ASAN_OPTIONS="};
    for (size_t i = 0; i < sizeof ours / sizeof ours[0]; i++)
        if (!strncmp(entry, ours[i], strlen(ours[i])))
            return true;
    for (size_t i = 0; i < KC_MAX_ENV && s->env[i]; i++) {
        const char *eq = strchr(s->env[i], '=');
        size_t n = eq ? (size_t)(eq - s->env[i]) + 1 : 0;
        if (n && !strncmp(entry, s->env[i], n))
            return true;
    }
    return false;
}

/* The child's environment: the parent's, minus fault settings, plus the
 * spec's. A preloaded shim must not upset a sanitizer build's link-order
 * check; an outer LD_PRELOAD is kept after ours. */
static char **child_env(const kc_spec *s, char *preload, size_t preload_cap, char *asan, size_t asan_cap)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + KC_MAX_ENV + 3, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    const char *outer_preload = getenv("LD_PRELOAD"), *outer_asan = getenv("ASAN_OPTIONS");
    for (size_t i = 0; i < n; i++)
        if (!child_env_drop(environ[i], s))
            env[k++] = environ[i];
    bool preloads = false;
    for (size_t i = 0; i < KC_MAX_ENV && s->env[i]; i++) {
        if (!strncmp(s->env[i], "LD_PRELOAD=", 11)) {
            preloads = true;
            snprintf(preload, preload_cap, "%s%s%s", s->env[i], outer_preload && *outer_preload ? ":" : "",
                     outer_preload ? outer_preload : "");
            env[k++] = preload;
        } else {
            env[k++] = (char *)s->env[i];
        }
    }
    if (!preloads && outer_preload) {
        snprintf(preload, preload_cap, "LD_PRELOAD=%s", outer_preload);
        env[k++] = preload;
    }
    if (preloads || outer_asan) {
        snprintf(asan, asan_cap, "ASAN_OPTIONS=%s%s%s", outer_asan ? outer_asan : "", outer_asan ? ":" : "",
                 preloads ? "verify_asan_link_order=0" : "");
        env[k++] = asan;
    }
    env[k] = NULL;
    return env;
}

typedef struct argv_buf {
    char *v[40];
    int n;
    char num[8][24];
    int nnum;
} argv_buf;

static void arg(argv_buf *a, const char *s)
{
    if (a->n < (int)(sizeof a->v / sizeof a->v[0]) - 1)
        a->v[a->n++] = (char *)s;
}

static void arg_num(argv_buf *a, const char *flag, int64_t v)
{
    if (a->nnum == 8)
        return;
    snprintf(a->num[a->nnum], sizeof a->num[0], "%" PRId64, v);
    arg(a, flag);
    arg(a, a->num[a->nnum++]);
}

static void child_argv(const kc_spec *s, argv_buf *a)
{
    a->n = a->nnum = 0;
    arg(a, s->world);
    if (s->data) {
        arg(a, "--data");
        arg(a, s->data);
    } else {
        arg(a, "--memory");
    }
    arg_num(a, "--seed", (int64_t)s->seed);
    arg_num(a, "--entities", s->entities);
    arg_num(a, "--until-tick", (int64_t)s->until);
    arg_num(a, "--workers", s->workers > 0 ? s->workers : 1);
    arg_num(a, "--checkpoint-every", s->ckpt_every);
    arg_num(a, "--report-fd", KC_REPORT_FD);
    arg(a, "--tick-rate");
    arg(a, s->tick_rate ? s->tick_rate : "0");
    arg(a, "--quiet");
    if (s->durability) {
        arg(a, "--durability");
        arg(a, s->durability);
    }
    if (s->wal_retain)
        arg(a, "--wal-retain");
    if (s->prefix)
        arg(a, "--report-prefix");
    if (s->extra_arg)
        arg(a, s->extra_arg);
    for (int i = 0; s->more && s->more[i]; i++)
        arg(a, s->more[i]);
    a->v[a->n] = NULL;
}

/* In the child, between fork and exec: the pipe on fd 3, the log on 1 and 2. */
static _Noreturn void child_exec(const kc_spec *s, char **argv, char **env, int wfd, int logfd, pid_t parent)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* keel-crash dies: so does the child */
    if (getppid() != parent)
        _exit(126);
    /* above every fd we place, so no dup2 below is a no-op that keeps O_CLOEXEC */
    int w = fcntl(wfd, F_DUPFD, 10), lg = fcntl(logfd, F_DUPFD, 10);
    int nul = open("/dev/null", O_RDONLY);
    if (w < 0 || lg < 0 || nul < 0 || dup2(nul, 0) < 0 || dup2(lg, 1) < 0 || dup2(lg, 2) < 0 ||
        dup2(w, KC_REPORT_FD) < 0)
        _exit(126);
    close(w);
    close(lg);
    close(nul);
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve(s->world, argv, env);
    dprintf(2, "keel-crash: cannot run %s: %s\n", s->world, strerror(errno));
    _exit(127);
}

struct kc_reader {
    char buf[1 << 16];
    size_t len;
};

/* Hand over the complete lines in r->buf. */
static void deliver(struct kc_reader *r, kc_line_fn fn, void *user)
{
    size_t start = 0;
    for (size_t i = 0; i < r->len; i++) {
        if (r->buf[i] != '\n')
            continue;
        kc_line l;
        if (!kc_line_parse(&l, r->buf + start, i - start)) {
            l.kind = NULL; /* a protocol break: the callback says so */
            l.n = 0;
        }
        fn(user, &l);
        start = i + 1;
    }
    memmove(r->buf, r->buf + start, r->len - start);
    r->len -= start;
    if (r->len == sizeof r->buf) { /* no newline in 64 KiB: a protocol break */
        kc_line l = {.kind = NULL};
        fn(user, &l);
        r->len = 0;
    }
}

int kc_proc_start(const kc_spec *s, kc_proc *p)
{
    *p = (kc_proc){.pid = -1, .fd = -1};
    argv_buf a;
    child_argv(s, &a);
    char preload[4096], asan[1024];
    char **env = child_env(s, preload, sizeof preload, asan, sizeof asan);
    int pp[2] = {-1, -1};
    int logfd = open(s->log ? s->log : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    p->r = calloc(1, sizeof *p->r);
    if (!env || logfd < 0 || !p->r || pipe2(pp, O_CLOEXEC)) {
        free(env);
        free(p->r);
        p->r = NULL;
        if (logfd >= 0)
            close(logfd);
        return -1;
    }
    pid_t parent = getpid();
    p->t0 = p->last = kc_now_ms();
    pid_t pid = fork();
    if (pid == 0)
        child_exec(s, a.v, env, pp[1], logfd, parent);
    int saved = errno;
    free(env);
    close(pp[1]);
    close(logfd);
    if (pid < 0) {
        close(pp[0]);
        free(p->r);
        p->r = NULL;
        errno = saved;
        return -1;
    }
    p->pid = pid;
    p->fd = pp[0];
    return 0;
}

int kc_proc_read(kc_proc *p, kc_line_fn fn, void *user)
{
    if (p->fd < 0)
        return 0;
    ssize_t n;
    do
        n = read(p->fd, p->r->buf + p->r->len, sizeof p->r->buf - p->r->len);
    while (n < 0 && errno == EINTR);
    if (n <= 0) {
        close(p->fd);
        p->fd = -1;
        return n < 0 ? -1 : 0;
    }
    p->r->len += (size_t)n;
    p->last = kc_now_ms();
    deliver(p->r, fn, user);
    return 1;
}

void kc_proc_drain(kc_proc *p, kc_line_fn fn, void *user)
{
    struct pollfd pf = {.fd = p->fd, .events = POLLIN};
    while (p->fd >= 0 && poll(&pf, 1, 0) > 0 && kc_proc_read(p, fn, user) > 0)
        ;
}

int kc_proc_reap(kc_proc *p)
{
    if (p->fd >= 0)
        close(p->fd);
    p->fd = -1;
    free(p->r);
    p->r = NULL;
    int status = 0;
    while (p->pid > 0 && waitpid(p->pid, &status, 0) < 0 && errno == EINTR)
        ;
    p->pid = -1;
    return status;
}

/* kc_child_run's view of the lines: the caller's callback, then the trigger. */
typedef struct sync_run {
    const kc_trigger *trig;
    kc_line_fn fn;
    void *user;
    uint64_t acks;
    bool state_seen, fired, started;
} sync_run;

/* Does this line fire the trigger? */
static bool trig_fires(sync_run *r, const kc_line *l)
{
    const kc_trigger *t = r->trig;
    if (!l->kind)
        return false;
    if (!strcmp(l->kind, "ack"))
        r->acks++;
    switch (t->kind) {
    case KC_TRIG_START:
        return !strcmp(l->kind, "start");
    case KC_TRIG_STATE:
        if (strcmp(l->kind, "state-end") || r->state_seen)
            return false;
        r->state_seen = true;
        return true;
    case KC_TRIG_TICK: {
        uint64_t t_ = 0;
        return !strcmp(l->kind, "tick") && kc_get_u64(l, "t", &t_) && t_ >= t->n;
    }
    case KC_TRIG_ACKS:
        return !strcmp(l->kind, "ack") && r->acks == t->n;
    case KC_TRIG_FINAL:
        return !strcmp(l->kind, "final");
    default:
        return false;
    }
}

static void sync_line(void *user, const kc_line *l)
{
    sync_run *r = user;
    if (l->kind && !strcmp(l->kind, "start"))
        r->started = true;
    if (r->fn)
        r->fn(r->user, l);
    if (trig_fires(r, l))
        r->fired = true;
}

int kc_child_run(const kc_spec *s, kc_line_fn fn, void *user, kc_exit *out)
{
    *out = (kc_exit){.start_ms = -1};
    kc_proc p;
    if (kc_proc_start(s, &p))
        return -1;
    out->spawned = true;
    sync_run sr = {.trig = &s->trig, .fn = fn, .user = user};
    double deadline = s->trig.kind == KC_TRIG_EXEC ? p.t0 + s->trig.delay_us / 1e3 : -1;
    while (p.fd >= 0) {
        double now = kc_now_ms();
        if (!out->killed && (kc_stop || (deadline >= 0 && now >= deadline) || now - p.last > s->hang_ms)) {
            out->hung = !kc_stop && !(deadline >= 0 && now >= deadline);
            kill(p.pid, SIGKILL);
            out->killed = true;
        }
        double wait = out->killed ? 1000 : s->hang_ms - (now - p.last);
        if (!out->killed && deadline >= 0 && deadline - now < wait)
            wait = deadline - now;
        struct pollfd pf = {.fd = p.fd, .events = POLLIN};
        int pr = poll(&pf, 1, wait < 0 ? 0 : (int)(wait + 0.999));
        if (pr < 0 && errno != EINTR)
            break;
        if (pr <= 0)
            continue;
        bool was_started = sr.started;
        if (kc_proc_read(&p, sync_line, &sr) <= 0)
            break;
        if (sr.started && !was_started)
            out->start_ms = p.last - p.t0;
        if (sr.fired && !out->killed && deadline < 0) {
            deadline = p.last + s->trig.delay_us / 1e3;
            if (!s->trig.delay_us) {
                kill(p.pid, SIGKILL);
                out->killed = true;
            }
        }
    }
    if (p.fd >= 0) { /* a poll error: do not leave the child behind */
        kill(p.pid, SIGKILL);
        out->killed = true;
    }
    out->status = kc_proc_reap(&p);
    /* a kill that raced with a clean exit did not land */
    if (out->killed && WIFEXITED(out->status))
        out->killed = false;
    return 0;
}

int kc_capture(char *const argv[], const char *env_add, bool with_stderr, char *buf, size_t cap)
{
    kc_spec s = {.env = {env_add}};
    char preload[4096], asan[1024];
    char **env = child_env(&s, preload, sizeof preload, asan, sizeof asan);
    int p[2];
    if (!env || cap == 0 || pipe2(p, O_CLOEXEC)) {
        free(env);
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        if (dup2(p[1], 1) < 0 || (with_stderr && dup2(p[1], 2) < 0))
            _exit(126);
        execve(argv[0], argv, env);
        _exit(127);
    }
    free(env);
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        return -1;
    }
    size_t len = 0;
    for (;;) {
        char tmp[4096];
        ssize_t n = read(p[0], tmp, sizeof tmp);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        size_t take = (size_t)n < cap - 1 - len ? (size_t)n : cap - 1 - len;
        memcpy(buf + len, tmp, take);
        len += take;
    }
    buf[len] = '\0';
    close(p[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
