/*
 * runtime/driver.c -- the TickDriver: ticks at tick_rate_hz on an absolute
 * deadline metronome.
 *
 * Deadline k is start + k * interval, computed from the start and never from
 * the previous wake-up, so lateness in one tick does not shift the ones
 * after it: a late tick is followed at once by the next (catch-up) until the
 * schedule is met again. Waiting goes sleep -> yield -> spin: an absolute
 * timed wait until RT_SLEEP_SLACK_NS before the deadline (the kernel may
 * overshoot a sleep by tens of microseconds; keel_runtime_stop cuts the wait
 * short, see sleep_until), then sched_yield until the last RT_SPIN_NS, then a
 * pause-loop to the deadline.
 *
 * After every tick the driver feeds the overload detector (overload.c) with
 * the tick's duration and its budget; under TICK_RATE_MODULATION the next
 * deadline is the previous one plus interval x multiplier, so the grid
 * stays absolute (never computed from a wake-up) while its spacing follows
 * the multiplier.
 */
#include <errno.h>
#include <sched.h>
#include <time.h>

#include "core/core.h"
#include "runtime/runtime_internal.h"

rt_wait_phase driver_wait_phase(uint64_t now_ns, uint64_t deadline_ns)
{
    if (now_ns >= deadline_ns)
        return RT_WAIT_DONE;
    uint64_t rem = deadline_ns - now_ns;
    if (rem > RT_SLEEP_SLACK_NS)
        return RT_WAIT_SLEEP;
    return rem > RT_SPIN_NS ? RT_WAIT_YIELD : RT_WAIT_SPIN;
}

/* Sleep until t (CLOCK_MONOTONIC) or a stop. Protocol: keel_runtime_stop
 * sets stop_requested and broadcasts stop_cond while holding stop_lock;
 * the sleeper tests the flag under the same lock before every wait, so a
 * stop either comes before the test (seen) or wakes the wait (never lost). */
static void sleep_until(keel_runtime *rt, uint64_t t)
{
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    pthread_mutex_lock(&rt->stop_lock);
    while (!atomic_load(&rt->stop_requested) && core_now_ns() < t)
        if (pthread_cond_timedwait(&rt->stop_cond, &rt->stop_lock, &ts) == ETIMEDOUT)
            break;
    pthread_mutex_unlock(&rt->stop_lock);
}

/* Wait for the deadline, or until a stop is requested (the caller tests the
 * flag next: the tick is not run). */
static void wait_until_real(keel_runtime *rt, uint64_t deadline)
{
    for (;;) {
        uint64_t now = core_now_ns();
        if (atomic_load(&rt->stop_requested))
            return;
        switch (driver_wait_phase(now, deadline)) {
        case RT_WAIT_DONE:  return;
        case RT_WAIT_SLEEP: sleep_until(rt, deadline - RT_SLEEP_SLACK_NS); break;
        case RT_WAIT_YIELD: sched_yield(); break;
        case RT_WAIT_SPIN:  core_cpu_relax(); break;
        }
    }
}

void runtime_test_set_clock(keel_runtime *rt, uint64_t (*clock_ns)(void *user),
                            void (*wait_until)(uint64_t deadline_ns, void *user), void *user)
{
    rt->clock_ns = clock_ns;
    rt->wait_until = wait_until;
    rt->clock_user = user;
    rt->next_deadline_ns = 0; /* a grid point of the other clock means nothing on this one */
}

static uint64_t driver_now(const keel_runtime *rt)
{
    return rt->clock_ns ? rt->clock_ns(rt->clock_user) : core_now_ns();
}

static void driver_wait(keel_runtime *rt, uint64_t deadline)
{
    if (rt->wait_until)
        rt->wait_until(deadline, rt->clock_user);
    else
        wait_until_real(rt, deadline);
}

void runtime_test_set_tick_cost(keel_runtime *rt, uint64_t (*cost)(void *user, uint64_t tick, uint64_t measured_ns),
                                void *user)
{
    rt->tick_cost = cost;
    rt->tick_cost_user = user;
}

void overload_publish(keel_runtime *rt)
{
    atomic_store_explicit(&rt->ovl_pub, (uint32_t)rt->ovl.level | ovl_multiplier(&rt->ovl) << 8,
                          memory_order_relaxed);
}

void overload_after_tick(keel_runtime *rt)
{
    if (!rt->ovl_enabled)
        return;
    ovl_change c = ovl_feed(&rt->ovl, rt->last_actual_ns, rt->last_target_ns);
    if (c == OVL_STAY)
        return;
    bool up = c == OVL_LEVEL_UP || c == OVL_MULT_UP;
    uint64_t tick = atomic_load(&rt->tick);
    if (up)
        rt->stats.overload_escalations++;
    else
        rt->stats.overload_deescalations++;
    overload_publish(rt);
    core_log(up ? KEEL_LOG_WARN : KEEL_LOG_INFO, "runtime", up ? "overload_up" : "overload_down",
             "level=%s multiplier=%u tick=%llu", keel_overload_level_name(rt->ovl.level), ovl_multiplier(&rt->ovl),
             (unsigned long long)tick);
    if (c == OVL_LEVEL_UP && rt->ovl.level == KEEL_OVERLOAD_PLAYER_SHEDDING) {
        rt->stats.critical_overloads++;
        if (rt->on_critical)
            rt->on_critical(rt, tick, rt->critical_user);
    }
    metrics_publish(rt, false); /* the step published before these counters changed */
}

/* Run up to `ticks` ticks (UINT64_MAX: until stopped) on this thread.
 * Back-to-back runs share one grid (keel_runtime_run, and the driver thread
 * after one): a run that starts before the previous run's next grid point
 * waits for it, so run(2); run(2) paces like run(4) and a caller running its
 * ticks in batches keeps the rate. A run that starts later starts a fresh
 * grid at the call; it does not catch up the ticks of the time between
 * runs. A grid point more than one interval ahead cannot come from the last
 * run (a clock that went back): it is not waited for. A stop requested
 * during a wait ends the run before the tick; *stopped says whether a stop
 * ended the run (one that came after its last tick did not, and is left for
 * the next). */
static int drive(keel_runtime *rt, uint64_t ticks, bool *stopped)
{
    bool throttled = rt->interval_ns > 0;
    uint64_t now = driver_now(rt), next = rt->next_deadline_ns;
    bool continues = throttled && next > now && next - now <= rt->interval_ns * ovl_multiplier(&rt->ovl);
    uint64_t deadline = continues ? next : now;
    *stopped = false;
    int rc = KEEL_OK;
    for (uint64_t k = 0; k < ticks; k++) {
        if (throttled && (k || continues))
            driver_wait(rt, deadline);
        if (atomic_load(&rt->stop_requested)) {
            *stopped = true;
            break;
        }
        if ((rc = runtime_step(rt)))
            break;
        overload_after_tick(rt);
        deadline += rt->interval_ns * ovl_multiplier(&rt->ovl); /* the next tick's interval */
        rt->next_deadline_ns = deadline;
    }
    /* A step skips its publication while a scrape reads; the run's end
     * waits for it, so a stopped runtime's metrics are its final counters. */
    metrics_publish(rt, true);
    return rc;
}

int keel_runtime_run(keel_runtime *rt, uint64_t ticks)
{
    if (!rt)
        return core_fail(KEEL_EINVAL, "keel_runtime_run: runtime is NULL");
    if (atomic_load(&rt->driver_running))
        return core_fail(KEEL_EBUSY, "keel_runtime_run: the tick driver is running");
    bool stopped;
    int rc = drive(rt, ticks, &stopped);
    if (stopped) /* a stop ends one run, not the next; one that came too late for this run ends the next */
        atomic_store(&rt->stop_requested, false);
    return rc;
}

static void *driver_main(void *arg)
{
    keel_runtime *rt = arg;
    bool stopped;
    rt->driver_status = drive(rt, UINT64_MAX, &stopped);
    return NULL;
}

int keel_runtime_start(keel_runtime *rt)
{
    if (!rt)
        return core_fail(KEEL_EINVAL, "keel_runtime_start: runtime is NULL");
    if (atomic_load(&rt->driver_running))
        return core_fail(KEEL_EBUSY, "keel_runtime_start: the tick driver is already running");
    if (!rt->ex.sched)
        return core_fail(KEEL_EINVAL, "keel_runtime_start: no schedule is installed");
    if (rt->data_dir) { /* open the data directory here, on the controlling thread */
        int rc = keel_runtime_recover(rt, NULL);
        if (rc)
            return rc;
    }
    atomic_store(&rt->stop_requested, false);
    rt->driver_status = 0;
    atomic_store(&rt->driver_running, true);
    if (pthread_create(&rt->driver, NULL, driver_main, rt)) {
        atomic_store(&rt->driver_running, false);
        return core_fail(KEEL_ENOMEM, "keel_runtime_start: cannot start the driver thread");
    }
    core_thread_name(rt->driver, "keel-driver");
    return KEEL_OK;
}

int keel_runtime_stop(keel_runtime *rt)
{
    if (!rt)
        return core_fail(KEEL_EINVAL, "keel_runtime_stop: runtime is NULL");
    pthread_mutex_lock(&rt->stop_lock); /* the sleep's protocol: sleep_until */
    atomic_store(&rt->stop_requested, true); /* also ends a keel_runtime_run in progress */
    pthread_cond_broadcast(&rt->stop_cond);
    pthread_mutex_unlock(&rt->stop_lock);
    if (!atomic_load(&rt->driver_running))
        return KEEL_OK;
    pthread_join(rt->driver, NULL);
    atomic_store(&rt->stop_requested, false);
    atomic_store(&rt->driver_running, false);
    return rt->driver_status;
}
