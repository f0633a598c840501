/*
 * runtime/watchdog.c -- reports systems that run longer than watchdog_ns.
 *
 * Each worker publishes what it runs in rt->ex.watch[w] (system, start time;
 * start 0 = idle). A watchdog thread looks every quarter period (at most
 * once a second) and reports, once per system run, a system whose current
 * task started more than watchdog_ns ago: a diagnostic and a flag the tick's
 * telemetry picks up. It never interrupts anything.
 *
 * The slot is read as (since, sys, tick, since again): a worker publishes
 * sys and tick before since (release), so when both reads of since agree,
 * sys and tick belong to that run. The report is a tick number stored in the
 * system's state, so it can only ever be counted for the run it is about; a
 * report that lands after that tick's telemetry was recorded shows in the
 * diagnostic only. The check runs under watchdog_lock, which
 * keel_runtime_set_schedule takes to replace the system state.
 */
#include <errno.h>
#include <time.h>

#include "core/core.h"
#include "runtime/runtime_internal.h"

/* Called with watchdog_lock held: keel_runtime_set_schedule takes it to
 * swap and free the schedule and the system state. */
static void check_workers(keel_runtime *rt)
{
    for (uint32_t w = 0; w < rt->ex.workers; w++) {
        sched_watch *slot = &rt->ex.watch[w];
        uint64_t since = atomic_load_explicit(&slot->since_ns, memory_order_acquire);
        if (!since)
            continue;
        uint64_t now = core_now_ns(); /* after since: a task that started meanwhile is not "negative" old */
        if (now <= since || now - since < rt->watchdog_ns)
            continue;
        uint32_t s = atomic_load_explicit(&slot->sys, memory_order_acquire);
        uint64_t tick = atomic_load_explicit(&slot->tick, memory_order_acquire);
        if (atomic_load_explicit(&slot->since_ns, memory_order_acquire) != since)
            continue; /* the worker moved on while we looked */
        if (!rt->ex.sched || s >= rt->ex.sched->nsys)
            continue;
        if (atomic_exchange(&rt->ex.st[s].watchdog_tick, tick) != tick)
            core_log(KEEL_LOG_WARN, "sched", "watchdog", "system=%s worker=%u tick=%llu running_ms=%llu",
                     rt->ex.sched->sys[s].d.name, w, (unsigned long long)tick,
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
        if (rc == ETIMEDOUT && !rt->watchdog_quit)
            check_workers(rt);
    }
    pthread_mutex_unlock(&rt->watchdog_lock);
    return NULL;
}

int watchdog_start(keel_runtime *rt)
{
    if (pthread_create(&rt->watchdog, NULL, watchdog_main, rt))
        return core_fail(KEEL_ENOMEM, "keel_runtime_create: cannot start the watchdog thread");
    core_thread_name(rt->watchdog, "keel-watchdog");
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
