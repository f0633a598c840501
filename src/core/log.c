/*
 * core/log.c -- structured, rate-limited diagnostics.
 *
 * Rate limiting is a fixed one-second window per (subsystem, event) pair:
 * the first KEEL_LOG_BURST events of a window are delivered, later ones are
 * counted, and the count rides on the next delivered event of that pair.
 * Pairs live in a small open-addressed table keyed by the addresses of the
 * two strings: callers pass string literals, so the addresses are stable and
 * cheap to compare. One mutex guards the table and serialises calls into the
 * handler (diagnostics are off the hot path by design: success logs nothing).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/core.h"

#define LOG_PAIRS 64              /* distinct pairs tracked; more share a slot */
#define LOG_WINDOW_NS 1000000000ull

typedef struct log_pair {
    const char *subsystem, *event;
    uint64_t window_start;
    uint32_t in_window;
    uint64_t suppressed;
} log_pair;

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static keel_log_fn log_handler;
static void *log_user;
static keel_log_level log_min = KEEL_LOG_INFO;
static log_pair log_pairs[LOG_PAIRS];
static uint64_t (*log_clock)(void);

static const char *level_name(keel_log_level l)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    return (unsigned)l < 4 ? names[l] : "?";
}

static void log_default(const keel_log_event *ev, void *user)
{
    (void)user;
    if (ev->suppressed)
        fprintf(stderr, "keel %s %s/%s %s suppressed=%llu\n", level_name(ev->level), ev->subsystem,
                ev->event, ev->fields, (unsigned long long)ev->suppressed);
    else
        fprintf(stderr, "keel %s %s/%s %s\n", level_name(ev->level), ev->subsystem, ev->event, ev->fields);
}

static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void keel_log_set(keel_log_fn fn, void *user, keel_log_level min_level)
{
    pthread_mutex_lock(&log_lock);
    log_handler = fn;
    log_user = user;
    log_min = min_level;
    pthread_mutex_unlock(&log_lock);
}

void core_log_set_clock(uint64_t (*now_ns)(void))
{
    pthread_mutex_lock(&log_lock);
    log_clock = now_ns;
    memset(log_pairs, 0, sizeof log_pairs);
    pthread_mutex_unlock(&log_lock);
}

/* The pair's slot; a pair that finds the table full takes over a slot. */
static log_pair *pair_slot(const char *subsystem, const char *event)
{
    uintptr_t key = (uintptr_t)subsystem * 31u + (uintptr_t)event;
    uint32_t i = (uint32_t)(core_mix64(key) & (LOG_PAIRS - 1));
    for (uint32_t n = 0; n < LOG_PAIRS; n++, i = (i + 1) & (LOG_PAIRS - 1)) {
        log_pair *p = &log_pairs[i];
        if (!p->subsystem || (p->subsystem == subsystem && p->event == event))
            return p;
    }
    return &log_pairs[i];
}

/* Decide under the lock whether this event is delivered; returns the number
 * of suppressed events to report with it, or UINT64_MAX to drop it. */
static uint64_t rate_limit(const char *subsystem, const char *event)
{
    uint64_t now = log_clock ? log_clock() : monotonic_ns();
    log_pair *p = pair_slot(subsystem, event);
    if (p->subsystem != subsystem || p->event != event) {
        *p = (log_pair){.subsystem = subsystem, .event = event, .window_start = now};
    } else if (now - p->window_start >= LOG_WINDOW_NS) {
        p->window_start = now;
        p->in_window = 0;
    }
    if (p->in_window >= KEEL_LOG_BURST) {
        p->suppressed++;
        return UINT64_MAX;
    }
    p->in_window++;
    uint64_t s = p->suppressed;
    p->suppressed = 0;
    return s;
}

void core_log(keel_log_level level, const char *subsystem, const char *event, const char *fields, ...)
{
    char text[256];
    va_list ap;
    va_start(ap, fields);
    vsnprintf(text, sizeof text, fields, ap);
    va_end(ap);

    pthread_mutex_lock(&log_lock);
    if (level >= log_min) {
        uint64_t suppressed = rate_limit(subsystem, event);
        if (suppressed != UINT64_MAX) {
            keel_log_event ev = {level, subsystem, event, text, suppressed};
            (log_handler ? log_handler : log_default)(&ev, log_user);
        }
    }
    pthread_mutex_unlock(&log_lock);
}
