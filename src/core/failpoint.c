/*
 * core/failpoint.c -- the failpoint registry, the spec parser and the slow
 * path of an armed point (core/failpoint.h has the protocol).
 *
 * It lives in keel_base, beside the last error, because both libraries have
 * points: the store's writes and commits are in libkeel_wal, the fence,
 * checkpoints, recovery and side transactions in the runtime.
 */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/failpoint.h"

static pthread_once_t fp_env_once = PTHREAD_ONCE_INIT;

/* Is every item of spec empty (NULL, "", " ; ")? */
static bool spec_blank(const char *spec)
{
    for (const char *p = spec; p && *p; p++)
        if (!isspace((unsigned char)*p) && *p != ';')
            return false;
    return true;
}

#ifdef KEEL_HAVE_FAILPOINTS

typedef enum fp_action { FP_OFF, FP_CRASH, FP_EIO, FP_ENOSPC, FP_DELAY } fp_action;

static const char *const fp_action_names[] = {"off", "crash", "eio", "enospc", "delay"};

typedef struct fp_cfg {
    fp_action action;
    uint32_t delay_ms;
    uint64_t nth;              /* 0: every hit */
} fp_cfg;

static const struct {
    const char *name;
    bool io;
} fp_points[CORE_FP_COUNT_] = {
#define CORE_FP_ROW_(id, name, io) {name, io},
    CORE_FAILPOINT_LIST(CORE_FP_ROW_)
#undef CORE_FP_ROW_
};

_Atomic uint32_t core_fp_armed[CORE_FP_COUNT_];

/* Everything below is guarded by fp_mu. */
static pthread_mutex_t fp_mu = PTHREAD_MUTEX_INITIALIZER;
static fp_cfg fp_cfgs[CORE_FP_COUNT_];
static uint64_t fp_hits[CORE_FP_COUNT_];
static core_fp_observer fp_observer;
static void *fp_observer_arg;

/* ---- the parser ------------------------------------------------------------------ */

typedef struct fp_text {
    const char *p;
    size_t n;
} fp_text;

static fp_text trim(const char *p, size_t n)
{
    while (n && isspace((unsigned char)*p))
        p++, n--;
    while (n && isspace((unsigned char)p[n - 1]))
        n--;
    return (fp_text){p, n};
}

static bool text_is(fp_text t, const char *s)
{
    return t.n == strlen(s) && !memcmp(t.p, s, t.n);
}

/* A decimal number in [lo, hi], digits only. */
static bool parse_num(fp_text t, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (!t.n || t.n > 19)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < t.n; i++) {
        if (!isdigit((unsigned char)t.p[i]))
            return false;
        v = v * 10 + (uint64_t)(t.p[i] - '0');
    }
    if (v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static int find_point(fp_text name)
{
    for (int i = 0; i < CORE_FP_COUNT_; i++)
        if (text_is(name, fp_points[i].name))
            return i;
    return -1;
}

#define FP_MAX_DELAY_MS 600000u   /* ten minutes */
#define FP_MAX_NTH 4294967295u

/* One item "name=action[@N]" (trimmed, non-empty) into cfgs. */
static int parse_item(fp_text item, fp_cfg *cfgs, bool *seen, char *err, size_t errlen)
{
    const char *eq = memchr(item.p, '=', item.n);
    if (!eq) {
        snprintf(err, errlen, "item '%.*s' has no '=' (expected name=action[@N])", (int)item.n, item.p);
        return KEEL_EINVAL;
    }
    fp_text name = trim(item.p, (size_t)(eq - item.p));
    fp_text rest = trim(eq + 1, item.n - (size_t)(eq - item.p) - 1);
    int id = find_point(name);
    if (id < 0) {
        snprintf(err, errlen, "unknown failpoint '%.*s' in item '%.*s' (keel_failpoint_name lists them)",
                 (int)name.n, name.p, (int)item.n, item.p);
        return KEEL_EINVAL;
    }
    if (seen[id]) {
        snprintf(err, errlen, "failpoint '%s' is named twice (item '%.*s')", fp_points[id].name, (int)item.n, item.p);
        return KEEL_EINVAL;
    }
    seen[id] = true;
    fp_cfg c = {0};
    const char *at = memchr(rest.p, '@', rest.n);
    fp_text act = trim(rest.p, at ? (size_t)(at - rest.p) : rest.n);
    if (at) {
        fp_text num = trim(at + 1, rest.n - (size_t)(at - rest.p) - 1);
        if (!parse_num(num, 1, FP_MAX_NTH, &c.nth)) {
            snprintf(err, errlen, "bad hit number '@%.*s' in item '%.*s' (expected @N with N in [1, %u])",
                     (int)num.n, num.p, (int)item.n, item.p, FP_MAX_NTH);
            return KEEL_EINVAL;
        }
    }
    const char *colon = memchr(act.p, ':', act.n);
    fp_text verb = trim(act.p, colon ? (size_t)(colon - act.p) : act.n);
    if (text_is(verb, "delay")) {
        uint64_t ms = 0;
        if (!colon || !parse_num(trim(colon + 1, act.n - (size_t)(colon - act.p) - 1), 0, FP_MAX_DELAY_MS, &ms)) {
            snprintf(err, errlen, "bad delay in item '%.*s' (expected delay:<ms> with ms in [0, %u])", (int)item.n,
                     item.p, FP_MAX_DELAY_MS);
            return KEEL_EINVAL;
        }
        c.action = FP_DELAY;
        c.delay_ms = (uint32_t)ms;
    } else if (!colon && text_is(verb, "crash")) {
        c.action = FP_CRASH;
    } else if (!colon && (text_is(verb, "eio") || text_is(verb, "enospc"))) {
        c.action = text_is(verb, "eio") ? FP_EIO : FP_ENOSPC;
        if (!fp_points[id].io) {
            snprintf(err, errlen, "failpoint '%s' guards no I/O: only crash and delay:<ms> apply there (item '%.*s')",
                     fp_points[id].name, (int)item.n, item.p);
            return KEEL_EINVAL;
        }
    } else {
        snprintf(err, errlen, "unknown action '%.*s' in item '%.*s' (expected crash, eio, enospc or delay:<ms>)",
                 (int)act.n, act.p, (int)item.n, item.p);
        return KEEL_EINVAL;
    }
    cfgs[id] = c;
    return KEEL_OK;
}

static int parse_spec(const char *spec, fp_cfg *cfgs, char *err, size_t errlen)
{
    bool seen[CORE_FP_COUNT_] = {false};
    memset(cfgs, 0, CORE_FP_COUNT_ * sizeof *cfgs);
    for (const char *p = spec ? spec : ""; *p;) {
        const char *end = strchr(p, ';');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        fp_text item = trim(p, n);
        if (item.n) {
            int rc = parse_item(item, cfgs, seen, err, errlen);
            if (rc)
                return rc;
        }
        p += n + (end != NULL);
    }
    return KEEL_OK;
}

static void apply(const fp_cfg *cfgs)
{
    pthread_mutex_lock(&fp_mu);
    for (int i = 0; i < CORE_FP_COUNT_; i++) {
        fp_cfgs[i] = cfgs[i];
        fp_hits[i] = 0;
        atomic_store_explicit(&core_fp_armed[i], cfgs[i].action != FP_OFF, memory_order_relaxed);
    }
    pthread_mutex_unlock(&fp_mu);
}

/* ---- the slow path --------------------------------------------------------------- */

static _Noreturn void crash(core_fp id, uint64_t hit)
{
    char line[128];
    int n = snprintf(line, sizeof line, "keel: failpoint %s (hit %llu): crash\n", fp_points[id].name,
                     (unsigned long long)hit);
    if (n > 0 && write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1) < 0)
        n = 0; /* nothing to do about it: we die next */
    raise(SIGKILL);
    _exit(128 + SIGKILL); /* not reached: SIGKILL cannot be caught */
}

static void sleep_ms(uint32_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

int core_fp_fire(core_fp id)
{
    pthread_mutex_lock(&fp_mu);
    fp_cfg c = fp_cfgs[id];
    uint64_t hit = ++fp_hits[id];
    bool fire = c.action != FP_OFF && (!c.nth || hit == c.nth);
    if (c.nth && hit >= c.nth) { /* its one hit is spent: back to the one-load fast path */
        fp_cfgs[id].action = FP_OFF;
        atomic_store_explicit(&core_fp_armed[id], 0, memory_order_relaxed);
    }
    core_fp_observer obs = fp_observer;
    void *obs_arg = fp_observer_arg;
    pthread_mutex_unlock(&fp_mu);
    if (!fire)
        return KEEL_OK;
    if (obs)
        obs(fp_points[id].name, fp_action_names[c.action], hit, obs_arg);
    switch (c.action) {
    case FP_CRASH:
        crash(id, hit);
    case FP_DELAY:
        sleep_ms(c.delay_ms);
        return KEEL_OK;
    case FP_EIO:
    case FP_ENOSPC: {
        int rc = c.action == FP_EIO ? KEEL_EIO : KEEL_ENOSPC;
        return core_fail(rc, "failpoint %s (hit %llu): injected %s (%s)", fp_points[id].name, (unsigned long long)hit,
                         c.action == FP_EIO ? "EIO" : "ENOSPC", strerror(c.action == FP_EIO ? EIO : ENOSPC));
    }
    default:
        return KEEL_OK;
    }
}

void core_fp_set_observer(core_fp_observer fn, void *arg)
{
    pthread_mutex_lock(&fp_mu);
    fp_observer = fn;
    fp_observer_arg = arg;
    pthread_mutex_unlock(&fp_mu);
}

/* ---- the public calls -------------------------------------------------------------- */

static void env_read(void)
{
    const char *spec = getenv("KEEL_FAILPOINTS");
    if (spec_blank(spec))
        return;
    fp_cfg cfgs[CORE_FP_COUNT_];
    char err[400];
    if (parse_spec(spec, cfgs, err, sizeof err)) {
        fprintf(stderr, "keel: KEEL_FAILPOINTS ignored: %s\n", err);
        return;
    }
    apply(cfgs);
}

void core_fp_env_init(void)
{
    pthread_once(&fp_env_once, env_read);
}

const char *keel_failpoint_name(size_t i)
{
    return i < CORE_FP_COUNT_ ? fp_points[i].name : NULL;
}

int keel_failpoints_set(const char *spec)
{
    core_fp_env_init(); /* read it now, so it cannot override this call later */
    fp_cfg cfgs[CORE_FP_COUNT_];
    char err[400];
    if (parse_spec(spec, cfgs, err, sizeof err))
        return core_fail(KEEL_EINVAL, "keel_failpoints_set: %s", err);
    apply(cfgs);
    return KEEL_OK;
}

bool keel_failpoints_compiled(void)
{
    return true;
}

#else /* !KEEL_HAVE_FAILPOINTS: the API stays, every point is gone */

static void env_read(void)
{
    if (!spec_blank(getenv("KEEL_FAILPOINTS")))
        fprintf(stderr, "keel: KEEL_FAILPOINTS ignored: failpoints are compiled out (built with "
                        "-DKEEL_FAILPOINTS=OFF)\n");
}

void core_fp_env_init(void)
{
    pthread_once(&fp_env_once, env_read);
}

const char *keel_failpoint_name(size_t i)
{
    (void)i;
    return NULL;
}

int keel_failpoints_set(const char *spec)
{
    core_fp_env_init();
    if (spec_blank(spec))
        return KEEL_OK;
    return core_fail(KEEL_EINVAL, "keel_failpoints_set: failpoints are compiled out (built with -DKEEL_FAILPOINTS=OFF); "
                                  "cannot arm '%.80s'", spec);
}

bool keel_failpoints_compiled(void)
{
    return false;
}

void core_fp_set_observer(core_fp_observer fn, void *arg)
{
    (void)fn;
    (void)arg;
}

#endif
