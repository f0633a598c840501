/*
 * runtime/watchdog.c -- reports systems that run longer than watchdog_ns.
 *
 * Each worker publishes what it runs in rt->watch[w] (system, start time;
 * start 0 = idle). A watchdog thread looks every quarter period (at most
 * once a second) and reports, once per system run, a system whose current
 * task started more than watchdog_ns ago: a diagnostic and a flag the tick's
 * telemetry picks up. It never interrupts anything.
 *
 * The slot is read as (since, sys, since again): a worker publishes sys
 * before since (release), so when both reads of since agree, sys belongs to
 * that run. A report that races with the end of a tick may be counted in
 * the next tick's telemetry; the diagnostic itself is always right.
 */
#include <errno.h>
#include <time.h>

#include "core/core.h"
#include "runtime/runtime_internal.h"

static void check_workers(keel_runtime *rt)
{
    uint64_t now = rt_now_ns();
    for (uint32_t w = 0; w < rt->workers; w++) {
        uint64_t since = atomic_load_explicit(&rt->watch[w].since_ns, memory_order_acquire);
        if (!since || now - since < rt->watchdog_ns)
            continue;
        uint32_t s = atomic_load_explicit(&rt->watch[w].sys, memory_order_acquire);
        if (atomic_load_explicit(&rt->watch[w].since_ns, memory_order_acquire) != since)
            continue; /* the worker moved on while we looked */
        /* st and sched are stable while a system runs: set_schedule refuses while ticking */
        if (!rt->sched || s >= rt->sched->nsys)
            continue;
        if (atomic_exchange(&rt->st[s].watchdog, 1) == 0)
            core_log(KEEL_LOG_WARN, "sched", "watchdog", "system=%s worker=%u tick=%llu running_ms=%llu",
                     rt->sched->sys[s].d.name, w, (unsigned long long)rt->running_tick,
                     (unsigned long long)((now - since) / 1000000ull));
    }
}

static void *watchdog_main(void *arg)
{
    keel_runtime *rt = arg;
    uint64_t period = rt->watchdog_ns / 4;
    if (period > 1000000000ull)
        period = 1000000000ull;
    if (period < 1000000ull)
        period = 1000000ull;
    pthread_mutex_lock(&rt->watchdog_lock);
    while (!rt->watchdog_quit) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + period;
        ts.tv_sec = (time_t)(t / 1000000000ull);
        ts.tv_nsec = (long)(t % 1000000000ull);
        int rc = pthread_cond_timedwait(&rt->watchdog_cond, &rt->watchdog_lock, &ts);
        if (rc == ETIMEDOUT && !rt->watchdog_quit) {
            pthread_mutex_unlock(&rt->watchdog_lock);
            check_workers(rt);
            pthread_mutex_lock(&rt->watchdog_lock);
        }
    }
    pthread_mutex_unlock(&rt->watchdog_lock);
    return NULL;
}

int watchdog_start(keel_runtime *rt)
{
    if (pthread_create(&rt->watchdog, NULL, watchdog_main, rt))
        return core_fail(KEEL_ENOMEM, "keel_runtime_create: cannot start the watchdog thread");
    rt->watchdog_running = true;
    return KEEL_OK;
}

void watchdog_stop(keel_runtime *rt)
{
    if (!rt->watchdog_running)
        return;
    pthread_mutex_lock(&rt->watchdog_lock);
    rt->watchdog_quit = true;
    pthread_cond_signal(&rt->watchdog_cond);
    pthread_mutex_unlock(&rt->watchdog_lock);
    pthread_join(rt->watchdog, NULL);
    rt->watchdog_running = false;
}
