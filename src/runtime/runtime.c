/*
 * runtime/runtime.c -- the runtime object and one tick.
 *
 * keel_runtime_step:
 *   1. refuse to start when commands of an earlier sync point are pending,
 *      when no schedule is installed, or when the schedule is stale;
 *   2. publish a read view if the world was changed between steps, so the
 *      tick starts from a published (tick-start) version;
 *   3. on the first tick, run on_first_tick in a transaction, apply its
 *      commands, publish again (snapshot readers of the first tick see the
 *      hook's state);
 *   4. Engine-Pre: run the closures submitted since the last tick, each in
 *      its own side transaction (txn/submit.c);
 *   5. dispatch every track in order (Engine-Pre, Public, user tracks,
 *      Engine-Post; empty tracks cost nothing); each system in its
 *      transaction, committed or rolled back as it completes;
 *   6. the unit of work captures the committed value changes;
 *   7. the structural sync point: every system's command buffers in
 *      execution order, a parallel system's buffers in task (= chunk) order,
 *      so the applied sequence does not depend on the worker count;
 *   8. tick end: publish the tick's read view (the old one is reclaimed
 *      after an RCU grace period), forget the tick's row versions,
 *      telemetry.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "core/failpoint.h"
#include "runtime/runtime_internal.h"

static int check_desc(const keel_runtime_desc *d)
{
    if (d->workers < -1 || d->workers > SCHED_MAX_WORKERS)
        return core_fail(KEEL_EINVAL, "keel_runtime_create: workers %d is not -1, 0 or in [1, %d]", d->workers,
                         SCHED_MAX_WORKERS);
    uint32_t cap = d->telemetry_capacity;
    if (cap && (cap & (cap - 1)))
        return core_fail(KEEL_EINVAL, "keel_runtime_create: telemetry_capacity %u is not a power of two", cap);
    if (d->durability < KEEL_DURABLE_DEFAULT || d->durability > KEEL_DURABLE_DEFERRED)
        return core_fail(KEEL_EINVAL, "keel_runtime_create: durability %d is not a keel_durability", (int)d->durability);
    if (!(d->watchdog_seconds >= 0 && d->watchdog_seconds <= 1e6))
        return core_fail(KEEL_EINVAL, "keel_runtime_create: watchdog_seconds must be in [0, 1e6]");
    double hz = d->tick_rate_hz;
    if (!(hz <= 100000) || (hz > 0 && hz < 0.01) || (hz < 0 && !(hz > -1e300)))
        return core_fail(KEEL_EINVAL, "keel_runtime_create: tick_rate_hz must be in [0.01, 100000], 0 or negative");
    const keel_durable_desc *dd = &d->durable;
    if (dd->dir && !*dd->dir)
        return core_fail(KEEL_EINVAL, "keel_runtime_create: durable.dir is empty (NULL means no data directory)");
    if (dd->zstd_level < -131072 || dd->zstd_level > 22)
        return core_fail(KEEL_EINVAL, "keel_runtime_create: durable.zstd_level %d is outside [-131072, 22]",
                         dd->zstd_level);
    if (dd->map_max && dd->map_size > dd->map_max)
        return core_fail(KEEL_EINVAL, "keel_runtime_create: durable.map_size exceeds durable.map_max");
    if (!(dd->checkpoint_every_seconds == dd->checkpoint_every_seconds))
        return core_fail(KEEL_EINVAL, "keel_runtime_create: durable.checkpoint_every_seconds is NaN");
    return KEEL_OK;
}

static uint32_t online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > SCHED_MAX_WORKERS ? SCHED_MAX_WORKERS : (uint32_t)n;
}

int keel_runtime_create(const keel_runtime_desc *desc, keel_runtime **out)
{
    if (!out)
        return core_fail(KEEL_EINVAL, "keel_runtime_create: out is NULL");
    core_fp_env_init(); /* KEEL_FAILPOINTS, once per process */
    keel_runtime_desc d = desc ? *desc : (keel_runtime_desc){0};
    int rc = check_desc(&d);
    if (rc)
        return rc;
    keel_runtime *rt = aligned_alloc(64, (sizeof(keel_runtime) + 63) & ~(size_t)63);
    if (!rt)
        return core_fail(KEEL_ENOMEM, "keel_runtime_create: out of memory");
    memset(rt, 0, sizeof *rt);
    rt->ex.workers = d.workers > 0 ? (uint32_t)d.workers : online_cpus();
    rt->tick_rate_hz = d.tick_rate_hz ? d.tick_rate_hz : 60.0;
    rt->interval_ns = rt->tick_rate_hz > 0 ? (uint64_t)(1e9 / rt->tick_rate_hz) : 0;
    rt->base_dt = rt->dt = rt->tick_rate_hz > 0 ? (float)(1.0 / rt->tick_rate_hz) : 1.0f / 60.0f;
    ovl_config ovl;
    rc = ovl_config_resolve(&d.overload, rt->tick_rate_hz, &ovl);
    if (rc) {
        free(rt);
        return rc;
    }
    ovl_init(&rt->ovl, &ovl);
    rt->ovl_enabled = !d.overload.disabled && rt->interval_ns > 0;
    rt->ex.ovl_divisor = d.overload.throttled_tick_divisor ? d.overload.throttled_tick_divisor : OVL_DEFAULT_DIVISOR;
    rt->on_critical = d.overload.on_critical_overload;
    rt->critical_user = d.overload.user;
    overload_publish(rt);
    rt->watchdog_ns = (uint64_t)((d.watchdog_seconds ? d.watchdog_seconds : 30.0) * 1e9);
    rt->on_first_tick = d.on_first_tick;
    rt->hook_user = d.hook_user;
    rt->durable_desc = d.durable;
    if (d.durable.dir && !(rt->data_dir = strdup(d.durable.dir))) {
        free(rt);
        return core_fail(KEEL_ENOMEM, "keel_runtime_create: out of memory");
    }
    rt->durable_desc.dir = rt->data_dir;
    if ((rc = repl_create(rt, &d.replication))) {
        free(rt->data_dir);
        free(rt);
        return rc;
    }
    bool durable_world = rt->data_dir != NULL;
    pthread_mutex_init(&rt->watchdog_lock, NULL);
    pthread_cond_init(&rt->watchdog_cond, NULL);
    metrics_init(rt);
    pthread_mutex_init(&rt->stop_lock, NULL);
    core_cond_init_monotonic(&rt->stop_cond); /* the metronome's clock (core_now_ns) */
    keel_durability mode = d.durability ? d.durability : KEEL_DURABLE_GROUP;
    rc = keel_world_create(&d.world, &rt->world);
    if (!rc) /* from the start: a change made before recovery would be lost */
        rt->world->log_required = durable_world;
    if (!rc)
        rc = txn_state_init(&rt->txn, rt->world, mode);
    if (!rc && d.durable.idempotency_window_ticks)
        rt->txn.keys.window = d.durable.idempotency_window_ticks;
    rt->ex.rt = rt;
    rt->ex.txn = &rt->txn;
    rt->ex.world = rt->world;
    rt->txn.pool = dispatch_pool(&rt->ex);
    if (!rc)
        rc = telemetry_init(rt, d.telemetry_capacity ? d.telemetry_capacity : 1024);
    if (!rc)
        rc = dispatch_init(&rt->ex);
    if (!rc)
        rc = watchdog_start(rt);
    if (rc) {
        (void)keel_runtime_close(rt); /* nothing was opened or committed yet: it cannot fail */
        return rc;
    }
    *out = rt;
    return KEEL_OK;
}

static void free_system_state(keel_runtime *rt)
{
    if (!rt->ex.st)
        return;
    for (uint32_t i = 0; i < rt->ex.sched->nsys; i++) {
        for (uint32_t k = 0; k < rt->ex.st[i].ncmds; k++) {
            keel_cmdbuf_destroy(rt->ex.st[i].cmds[k]);
            txn_part_fini(&rt->ex.st[i].parts[k]);
        }
        free(rt->ex.st[i].cmds);
        free(rt->ex.st[i].parts);
        free(rt->ex.st[i].changes.v);
        free(rt->ex.st[i].chunks);
        free((void *)rt->ex.st[i].ranges);
    }
    free(rt->ex.st);
    rt->ex.st = NULL;
}

/* on_shutdown, in an IMMEDIATE side transaction: 0, or why its writes are
 * not applied (its own non-zero return or the commit's code), with the
 * last error saying which. */
static int run_on_shutdown(keel_runtime *rt)
{
    keel_side_txn *tx = NULL;
    int rc = side_begin_full(&rt->txn, KEEL_DURABLE_IMMEDIATE, &tx);
    if (rc)
        return core_fail_prefix(rc, "keel_runtime_close: on_shutdown could not start its transaction");
    rc = rt->durable_desc.on_shutdown(tx, rt->durable_desc.shutdown_arg);
    if (rc) {
        keel_side_txn_abort(tx);
        core_fail(rc, "keel_runtime_close: on_shutdown returned %d (%s): its writes are not applied", rc,
                  keel_strerror(rc));
    } else if ((rc = keel_side_txn_commit(tx)) == KEEL_EUNAVAILABLE) {
        rc = KEEL_OK; /* applied, on the local disk; the stream's part is the close's (repl_close) */
    } else if (rc) {
        core_fail_prefix(rc, "keel_runtime_close: on_shutdown's transaction did not commit (%s): its writes are "
                             "not applied", keel_strerror(rc));
    }
    if (rc)
        core_log(KEEL_LOG_WARN, "runtime", "on_shutdown_failed", "code=%s", keel_strerror(rc));
    return rc;
}

/* on_shutdown; then every record is made durable before the writer stops.
 * A runtime that is (or becomes, in the final flush) fatal returns
 * KEEL_EFATAL with a sentence naming the cause, the directory and what a
 * reopen recovers: after close the caller has no runtime left to ask. That
 * outranks an on_shutdown failure, whose code is returned otherwise. */
static int shutdown_durable(keel_runtime *rt)
{
    int rc = KEEL_OK;
    int was_fatal = rt->dur ? dur_fatal(rt->dur) : 0;
    char why[512] = ""; /* on_shutdown's failure, said again at the end (later calls set other sentences) */
    if (rt->dur)
        repl_closing(rt); /* from here, a sync primary's stream gets a bounded time (on_shutdown's commit too) */
    if (rt->durable_desc.on_shutdown && (!rt->data_dir || (rt->dur && !was_fatal)) && repl_may_tick(rt) &&
        (rc = run_on_shutdown(rt)))
        snprintf(why, sizeof why, "%s", keel_last_error());
    if (!rt->dur)
        return rc;
    char unsettled[512] = ""; /* a replica's bootstrap copy that failed (it latched fatal) */
    if (repl_settle(rt))
        snprintf(unsettled, sizeof unsettled, "%s", keel_last_error());
    repl_close_info ci = {0};
    if (!dur_fatal(rt->dur)) /* failing latches fatal: reported below */
        ci.stream_behind = dur_wait(rt->dur, dur_last_lsn(rt->dur), true) == KEEL_EUNAVAILABLE;
    view_quiesce(); /* a pending reclaim consults the checkpoint pin in rt->dur */
    /* the stream's part first: a fence it finds latches too */
    bool unreplicated = repl_close(rt, true, &ci) == KEEL_EUNAVAILABLE;
    int fatal = dur_fatal(rt->dur);
    if (fatal && unsettled[0]) {
        rc = core_fail(KEEL_EFATAL, "keel_runtime_close: %s", unsettled);
    } else if (fatal) {
        submit_refuse(&rt->txn, KEEL_EFATAL); /* closures queued before the latch never run */
        rc = core_fail(KEEL_EFATAL,
                       "keel_runtime_close: %s (%s) in data directory %s: what was committed after LSN %llu is "
                       "not on disk; reopening the directory recovers tick %llu and the side transactions "
                       "durable with it",
                       was_fatal ? "the runtime had latched fatal" : "the final flush failed", keel_strerror(fatal),
                       rt->data_dir, (unsigned long long)keel_durable_lsn(rt),
                       (unsigned long long)atomic_load(&rt->dur->durable_tick));
    } else if (rc) {
        core_fail(rc, "%s", why);
    } else if (unreplicated) {
        rc = core_fail(KEEL_EUNAVAILABLE,
                       "keel_runtime_close: the replication stream acknowledged LSN %llu of %llu: the rest is on "
                       "the local disk of data directory %s only, never acknowledged; the next open keeps what the "
                       "stream took meanwhile and drops the others",
                       (unsigned long long)ci.published, (unsigned long long)ci.committed, rt->data_dir);
    }
    runtime_close_data_dir(rt);
    return rc;
}

int keel_runtime_close(keel_runtime *rt)
{
    if (!rt)
        return KEEL_OK;
    if (atomic_load(&rt->driver_running))
        keel_runtime_stop(rt);
    runtime_fence_join(rt);
    int rc = rt->world ? shutdown_durable(rt) : KEEL_OK;
    char why[512];
    snprintf(why, sizeof why, "%s", rc ? keel_last_error() : "");
    watchdog_stop(rt);
    dispatch_fini(&rt->ex);
    free_system_state(rt);
    if (rt->ex.sched)
        schedule_free(rt->ex.sched);
    keel_cmdbuf_destroy(rt->hook_cmds);
    txn_part_fini(&rt->hook_part);
    free(rt->hook_changes.v);
    if (rt->txn.world)
        txn_state_fini(&rt->txn);
    telemetry_fini(rt);
    metrics_fini(rt);
    keel_world_destroy(rt->world);
    repl_free(rt);
    pthread_mutex_destroy(&rt->watchdog_lock);
    pthread_cond_destroy(&rt->watchdog_cond);
    pthread_mutex_destroy(&rt->stop_lock);
    pthread_cond_destroy(&rt->stop_cond);
    free(rt->data_dir);
    free(rt);
    return rc ? core_fail(rc, "%s", why) : KEEL_OK; /* the teardown may have set another last error */
}

keel_world *keel_runtime_world(keel_runtime *rt)
{
    return rt ? rt->world : NULL;
}

uint32_t keel_runtime_workers(const keel_runtime *rt)
{
    return rt ? rt->ex.workers : 0;
}

uint64_t keel_runtime_tick(const keel_runtime *rt)
{
    return rt ? atomic_load(&rt->tick) : 0;
}

keel_overload_level keel_runtime_overload(const keel_runtime *rt, uint32_t *multiplier)
{
    uint32_t v = rt ? atomic_load_explicit(&rt->ovl_pub, memory_order_relaxed) : 1u << 8;
    if (multiplier)
        *multiplier = v >> 8;
    return (keel_overload_level)(v & 0xff);
}

int keel_runtime_release_memory(keel_runtime *rt, uint64_t *released)
{
    if (released)
        *released = 0;
    if (!rt)
        return core_fail(KEEL_EINVAL, "keel_runtime_release_memory: runtime is NULL");
    if (atomic_load(&rt->driver_running))
        return core_fail(KEEL_EBUSY, "keel_runtime_release_memory: the tick driver is running");
    if (rt->world->in_tick) /* a system, closure or on_first_tick of the running tick */
        return core_fail(KEEL_EBUSY, "keel_runtime_release_memory: called during tick %llu",
                         (unsigned long long)atomic_load_explicit(&rt->txn.running_tick, memory_order_relaxed));
    uint64_t bytes = version_release_spares(rt->world);
    if (released)
        *released = bytes;
    return KEEL_OK;
}

int keel_schedule_create(keel_runtime *rt, keel_schedule **out)
{
    if (!rt || !out)
        return core_fail(KEEL_EINVAL, "keel_schedule_create: runtime or out is NULL");
    return schedule_create(rt, rt->world, out);
}

int keel_runtime_set_schedule(keel_runtime *rt, keel_schedule *s)
{
    if (!rt || !s)
        return core_fail(KEEL_EINVAL, "keel_runtime_set_schedule: runtime or schedule is NULL");
    if (s->rt != rt)
        return core_fail(KEEL_EINVAL, "keel_runtime_set_schedule: the schedule belongs to another runtime");
    if (!s->built || !s->ok)
        return core_fail(KEEL_EINVAL, "keel_runtime_set_schedule: the schedule is %s",
                         s->built ? "built with errors" : "not built");
    if (atomic_load(&rt->driver_running))
        return core_fail(KEEL_EBUSY, "keel_runtime_set_schedule: the tick driver is running");
    if (rt->sync_pending || rt->hook_pending)
        return core_fail(KEEL_EBUSY, "keel_runtime_set_schedule: commands of the last sync point are pending");
    sched_run *st = aligned_alloc(64, (s->nsys + 1) * sizeof *st);
    if (st)
        memset(st, 0, (s->nsys + 1) * sizeof *st);
    if (!st)
        return core_fail(KEEL_ENOMEM, "keel_runtime_set_schedule: out of memory");
    keel_schedule *old = rt->ex.sched;
    metrics_lock(rt); /* a scrape reads the systems' names and counters under it */
    pthread_mutex_lock(&rt->watchdog_lock); /* the watchdog reads st and sched under it */
    free_system_state(rt);
    rt->ex.st = st;
    rt->ex.sched = s;
    pthread_mutex_unlock(&rt->watchdog_lock);
    for (uint32_t i = 0; i < s->nsys; i++)
        dispatch_reset_system(&rt->ex, i);
    int rc = dispatch_prepare(&rt->ex);
    if (!rc)
        rc = telemetry_size(rt, s->nsys);
    if (!rc)
        rc = metrics_size(rt, s->nsys);
    if (rc) {
        free_system_state(rt);
        rt->ex.sched = NULL;
        metrics_unlock(rt);
        return rc;
    }
    s->installed = true;
    if (old && old != s)
        schedule_free(old);
    metrics_unlock(rt);
    return KEEL_OK;
}

/* ---- the sync point ----------------------------------------------------------- */

static void count_applied(keel_runtime *rt, const keel_cmdbuf *cb)
{
    keel_cmd_result r = keel_cmdbuf_result(cb);
    rt->stats.commands_applied += (uint64_t)r.spawned + r.destroyed + r.added + r.removed + r.ignored_null +
                                  r.ignored_stale + r.ignored_absent;
}

/* Attach the unit of work's lifecycle log to command playback while the
 * change set is being captured. */
static void log_lifecycle(keel_runtime *rt, bool on)
{
    rt->world->lifecycle = on && rt->txn.uow.capture ? &rt->txn.uow.lifecycle : NULL;
}

static int apply_hook_commands(keel_runtime *rt)
{
    log_lifecycle(rt, true);
    int rc = keel_cmdbuf_apply(rt->hook_cmds);
    log_lifecycle(rt, false);
    rt->hook_pending = rc != 0;
    if (rc)
        return core_fail_prefix(rc, "on_first_tick's commands failed");
    keel_cmdbuf_reset(rt->hook_cmds);
    return KEEL_OK;
}

/* Apply the commands from (sync_pos, sync_task) on, in execution order. */
static int sync_point(keel_runtime *rt)
{
    const keel_schedule *sc = rt->ex.sched;
    log_lifecycle(rt, true);
    for (; rt->sync_pos < sc->nsys; rt->sync_pos++, rt->sync_task = 0) {
        sched_run *st = &rt->ex.st[sc->order[rt->sync_pos]];
        for (; rt->sync_task < st->ncmds; rt->sync_task++) {
            keel_cmdbuf *cb = st->cmds[rt->sync_task];
            if (cmdbuf_idle(cb)) /* most systems record nothing in a tick */
                continue;
            int rc = keel_cmdbuf_apply(cb);
            if (rc) {
                rt->sync_pending = true;
                log_lifecycle(rt, false);
                return core_fail_prefix(rc, "sync point: commands of system '%s' failed",
                                        sc->sys[sc->order[rt->sync_pos]].d.name);
            }
            count_applied(rt, cb);
            keel_cmdbuf_reset(cb); /* receipts and counters start over next tick */
        }
    }
    rt->sync_pending = false;
    rt->sync_pos = rt->sync_task = 0;
    log_lifecycle(rt, false);
    return KEEL_OK;
}

static int sync_retry_once(keel_runtime *rt)
{
    runtime_fence_join(rt);
    if (!rt->hook_pending && !rt->sync_pending)
        return KEEL_OK;
    if (rt->dur && dur_fatal(rt->dur))
        return core_fail(KEEL_EFATAL, "keel_runtime_sync_retry: the runtime latched fatal (%s)",
                         keel_strerror(dur_fatal(rt->dur)));
    bool hook = rt->hook_pending;
    size_t life_from = rt->txn.uow.lifecycle.len;
    int rc = hook ? apply_hook_commands(rt) : sync_point(rt);
    /* what the retry applied is logged as a unit of its own: the hook's
     * (for the tick that has not run yet) or the last tick's again */
    if (rt->dur && rt->txn.uow.lifecycle.len > life_from) {
        int frc = fence_retry(rt->dur, hook ? atomic_load(&rt->tick) + 1 : atomic_load(&rt->tick), hook, life_from);
        if (frc) {
            dur_latch_fatal(rt->dur, frc == KEEL_EFATAL ? dur_fatal(rt->dur) : frc);
            return KEEL_EFATAL;
        }
    }
    return rc;
}

/* fn -- a step, or a retry of its sync point: both apply commands and run
 * a fence on the stepping thread -- marked for the checkpoint thread, which
 * serialises between steps. */
static int marked_step(keel_runtime *rt, int (*fn)(keel_runtime *))
{
    dur_state *d = rt->dur; /* read once: when a step's own recovery opens it, neither edge counts */
    if (d)
        ckpt_step_edge(d);
    int rc = fn(rt);
    if (d)
        ckpt_step_edge(d);
    return rc;
}

int keel_runtime_sync_retry(keel_runtime *rt)
{
    if (!rt)
        return core_fail(KEEL_EINVAL, "keel_runtime_sync_retry: runtime is NULL");
    return marked_step(rt, sync_retry_once);
}

/* Drop a buffer's queued commands and its counters (they were counted or
 * will never be). */
static void drop_commands(keel_cmdbuf *cb)
{
    keel_cmdbuf_discard(cb);
    keel_cmdbuf_reset(cb);
}

void keel_runtime_sync_discard(keel_runtime *rt)
{
    if (!rt)
        return;
    if (rt->hook_pending) {
        drop_commands(rt->hook_cmds);
        rt->hook_pending = false;
    }
    if (!rt->sync_pending)
        return;
    const keel_schedule *sc = rt->ex.sched;
    for (uint32_t p = rt->sync_pos; p < sc->nsys; p++) {
        sched_run *st = &rt->ex.st[sc->order[p]];
        for (uint32_t k = 0; k < st->ncmds; k++)
            drop_commands(st->cmds[k]);
    }
    rt->sync_pending = false;
    rt->sync_pos = rt->sync_task = 0;
}

/* ---- one tick ----------------------------------------------------------------- */

/* on_first_tick: runs until it succeeds once. Its commands are applied at
 * once, under the sync point's failure policy: a failed playback leaves them
 * pending (the hook is not run again) until keel_runtime_sync_retry or
 * keel_runtime_sync_discard. */
static int first_tick_hook(keel_runtime *rt)
{
    if (rt->first_tick_done)
        return KEEL_OK;
    if (!rt->on_first_tick) {
        rt->first_tick_done = true;
        return KEEL_OK;
    }
    if (!rt->hook_cmds && keel_cmdbuf_create(rt->world, &rt->hook_cmds))
        return KEEL_ENOMEM;
    keel_ctx ctx = {.rt = rt, .txn = &rt->txn, .sys = TXN_NO_SYSTEM, .name = "on_first_tick", .cmds = rt->hook_cmds, .part = &rt->hook_part};
    int rc = rt->on_first_tick(&ctx, rt->hook_user);
    if (!rc)
        rc = ctx.fail_rc;
    if (!rc)
        rc = txn_commit(rt->world, &rt->hook_part, 1, &rt->hook_changes);
    if (rc) {
        txn_abort(rt->world, &rt->hook_part, 1, &rt->hook_changes);
        keel_cmdbuf_discard(rt->hook_cmds);
        keel_cmdbuf_reset(rt->hook_cmds);
        return core_fail(rc, "on_first_tick failed (%s); it runs again on the next step", keel_strerror(rc));
    }
    rt->first_tick_done = true;
    /* the hook's values are captured before its commands move any row */
    uow_capture_changes(&rt->txn, &rt->hook_changes);
    rt->txn.uow.hook_rows_end = rt->txn.uow.ngroups;
    rc = apply_hook_commands(rt);
    if (!rc)
        rc = view_publish(&rt->txn, atomic_load(&rt->tick)); /* the tick starts from the hook's state */
    return rc;
}

static int can_step(keel_runtime *rt)
{
    if (rt->data_dir) { /* never run in memory what should be durable */
        int rc = keel_runtime_recover(rt, NULL);
        if (rc)
            return rc;
    }
    if (rt->dur && dur_fatal(rt->dur)) {
        submit_refuse(&rt->txn, KEEL_EFATAL); /* their tickets would otherwise wait for a step that never runs */
        return core_fail(KEEL_EFATAL, "keel_runtime_step: the runtime latched fatal (%s): nothing more can be made "
                                      "durable; close it and open the data directory again",
                         keel_strerror(dur_fatal(rt->dur)));
    }
    if (!repl_may_tick(rt))
        return core_fail(KEEL_EBUSY, "keel_runtime_step: a standby or follower applies its primary's ticks "
                                     "(keel_replica_poll); it ticks once promoted");
    if (!rt->ex.sched)
        return core_fail(KEEL_EINVAL, "keel_runtime_step: no schedule is installed");
    if (rt->ex.sched->registry_stamp != rt->world->ncomps)
        return core_fail(KEEL_EINVAL, "keel_runtime_step: the schedule is stale: components were registered after it "
                                      "was built (%u then, %u now); build a new one",
                         rt->ex.sched->registry_stamp, rt->world->ncomps);
    if (rt->sync_pending || rt->hook_pending || keel_world_pending(rt->world))
        return core_fail(KEEL_EBUSY, "keel_runtime_step: commands of an earlier sync point are pending; "
                                     "call keel_runtime_sync_retry or keel_runtime_sync_discard");
    return KEEL_OK;
}

/* After the user tracks: the unit of work captures the committed systems'
 * changes, in execution order. */
static void capture_changes(keel_runtime *rt)
{
    const keel_schedule *sc = rt->ex.sched;
    const txn_vec **lists = uow_lists(&rt->txn.uow, sc->nsys);
    for (uint32_t p = 0; lists && p < sc->nsys; p++)
        lists[p] = &rt->ex.st[sc->order[p]].changes;
    uow_capture(&rt->txn, lists, sc->nsys);
}

/* Forget the tick's transactional bookkeeping. */
static void txn_tick_end(keel_runtime *rt)
{
    rt->hook_changes.n = 0;
    for (uint32_t i = 0; i < rt->ex.sched->nsys; i++)
        rt->ex.st[i].changes.n = 0;
    side_tick_end(&rt->txn);
    rt->txn.side_commits_tick = 0;
}

/* The overload level and multiplier the detector left apply to this whole
 * tick: copied here, before any system runs, for dispatch and keel_ctx_dt. */
static void overload_tick_start(keel_runtime *rt)
{
    rt->ex.tick_level = rt->ovl.level;
    rt->tick_mult = ovl_multiplier(&rt->ovl);
    rt->dt = rt->base_dt * (float)rt->tick_mult;
}

static void tick_end(keel_runtime *rt, uint64_t start, uint64_t sync_start)
{
    uint64_t end = core_now_ns();
    keel_tick_record rec = {
        .tick = atomic_load_explicit(&rt->txn.running_tick, memory_order_relaxed),
        .start_ns = start,
        .target_ns = rt->interval_ns * rt->tick_mult,
        .actual_ns = end - start,
        .overload_level = rt->ex.tick_level,
        .multiplier = rt->tick_mult,
        .entities = keel_world_count(rt->world),
        .sync_start_ns = sync_start,
        .sync_ns = rt->sync_end_ns - sync_start,
    };
    if (rt->dur) {
        rec.wal_raw_bytes = rt->dur->fence_raw_bytes;
        rec.wal_stored_bytes = rt->dur->fence_stored_bytes;
        rec.fence_ns = rt->fence_ns;
        uint64_t durable = atomic_load_explicit(&rt->dur->durable_tick, memory_order_acquire);
        rec.durable_lag = rec.tick > durable ? rec.tick - durable : 0;
    }
    if (rt->tick_cost)
        rec.actual_ns = rt->tick_cost(rt->tick_cost_user, rec.tick, rec.actual_ns);
    rec.overrun = rec.target_ns ? (double)rec.actual_ns / (double)rec.target_ns : 0;
    rec.side_txns = rt->txn.side_commits_tick;
    rec.checkpoint = rt->tick_ckpt || (rt->dur && ckpt_active(rt->dur));
    for (uint32_t w = 0; w < rt->ex.workers; w++) {
        sched_scratch *sc = &rt->ex.scratch[w];
        rec.systems_run += sc->run;
        rec.systems_failed += sc->failed;
        rec.systems_skipped += sc->skipped;
        rec.systems_throttled += sc->throttled;
        rt->stats.commits += sc->commits;
        rt->stats.aborts += sc->aborts;
        sc->run = sc->failed = sc->skipped = sc->throttled = sc->commits = sc->aborts = 0;
    }
    telemetry_record(rt, &rec); /* adds the watchdog reports and the deferred rows */
    rt->last_actual_ns = rec.actual_ns;
    rt->last_target_ns = rec.target_ns;
    rt->stats.systems_run += rec.systems_run;
    rt->stats.systems_failed += rec.systems_failed;
    rt->stats.systems_skipped += rec.systems_skipped;
    rt->stats.watchdog_reports += rec.watchdog_reports;
    rt->stats.systems_throttled += rec.systems_throttled;
    rt->stats.rows_deferred += rec.deferred_rows;
    rt->stats.ticks_at_level[rec.overload_level]++;
    core_hist_observe(&rt->met.tick_hist, rec.actual_ns);
    rt->met.skipped += rec.multiplier > 1 ? rec.multiplier - 1 : 0; /* grid points a stretched interval passed over */
}

/* A periodic checkpoint that cannot be captured for lack of memory is not
 * taken, and the next tick asks again: nothing is lost (the WAL holds every
 * tick since the last checkpoint), so only what endangers the log itself
 * latches the runtime fatal. An explicit keel_checkpoint returns the code. */
static int periodic_checkpoint(keel_runtime *rt, uint64_t tick)
{
    int rc = ckpt_maybe(rt->dur, tick, false);
    if (rc != KEEL_ENOMEM)
        return rc;
    core_log(KEEL_LOG_WARN, "wal", "checkpoint_skipped", "tick=%llu reason=out_of_memory", (unsigned long long)tick);
    return KEEL_OK;
}

/* The tick itself, without the driver check (the driver thread uses it). */
static int step_once(keel_runtime *rt)
{
    runtime_fence_join(rt); /* the last tick's records are queued whole before this tick touches the pool */
    int rc = can_step(rt);
    if (rc)
        return rc;
    keel_world *w = rt->world;
    keel_world_freeze(w);
    if (w->mutations != rt->txn.pub_mutations && (rc = view_publish(&rt->txn, atomic_load(&rt->tick))))
        return rc;
    uint64_t start = dispatch_anchor(&rt->ex); /* the systems' stamps extrapolate from here */
    atomic_store_explicit(&rt->txn.running_tick, atomic_load(&rt->tick) + 1, memory_order_relaxed);
    overload_tick_start(rt);
    rt->tick_ckpt = rt->dur && ckpt_active(rt->dur);
    uow_reset(&rt->txn.uow);
    if (rt->dur)
        fence_tick_start(rt->dur);
    w->in_tick = true;
    bool hook_ran = !rt->first_tick_done;
    rc = first_tick_hook(rt);
    /* the hook's unit is logged also when its commands failed part-way: the
     * applied prefix stays (keel_runtime_sync_retry logs the rest) */
    if ((!rc || rt->hook_pending) && hook_ran && rt->dur) {
        int frc = fence_hook(rt->dur, atomic_load(&rt->txn.running_tick));
        if (frc) {
            dur_latch_fatal(rt->dur, frc == KEEL_EFATAL ? dur_fatal(rt->dur) : frc);
            rc = KEEL_EFATAL;
        }
    }
    if (rc) {
        w->in_tick = false;
        txn_tick_end(rt);
        return rc;
    }
    submit_run(&rt->txn);
    const keel_schedule *sc = rt->ex.sched;
    for (uint32_t t = 0; t < sc->ntracks; t++)
        dispatch_track(&rt->ex, &sc->tracks[t]);
    w->in_tick = false;
    capture_changes(rt);
    uint64_t sync_start = core_now_ns();
    int sync_rc = sync_point(rt);
    uint64_t tick = atomic_load_explicit(&rt->txn.running_tick, memory_order_relaxed);
    int fence_rc = KEEL_OK;
    rt->sync_end_ns = core_now_ns();
    if (rt->dur) {
        uint64_t f0 = rt->sync_end_ns;
        if ((fence_rc = fence_tick(rt->dur, tick)))
            dur_latch_fatal(rt->dur, fence_rc == KEEL_EFATAL ? dur_fatal(rt->dur) : fence_rc);
        rt->fence_ns = core_now_ns() - f0;
    }
    /* every completed tick is published (readers see the last completed
     * tick even when it changed nothing: the view is then the same data
     * under the new tick number, O(chunks) pointer copies) */
    if (view_publish(&rt->txn, atomic_load_explicit(&rt->txn.running_tick, memory_order_relaxed)))
        w->mutations++; /* out of memory: the next step publishes instead */
    tick_end(rt, start, sync_start); /* reads side_commits_tick: before txn_tick_end resets it */
    txn_tick_end(rt);
    atomic_store(&rt->tick, tick);
    rt->stats.ticks++;
    metrics_publish(rt, false);
    if (rt->dur && !fence_rc) {
        if (rt->txn.durability == KEEL_DURABLE_IMMEDIATE)
            fence_rc = dur_wait(rt->dur, dur_last_lsn(rt->dur), false); /* the tick returns only once it is on disk */
        if (!fence_rc && w->mutations == rt->txn.pub_mutations)
            fence_rc = periodic_checkpoint(rt, tick);
        if (!fence_rc && ckpt_active(rt->dur))
            telemetry_mark_checkpoint(rt, tick); /* the capture was part of this tick's step */
        if (fence_rc && fence_rc != KEEL_EFATAL)
            dur_latch_fatal(rt->dur, fence_rc);
    }
    return fence_rc ? KEEL_EFATAL : sync_rc;
}

int runtime_step(keel_runtime *rt)
{
    return marked_step(rt, step_once);
}

int keel_runtime_step(keel_runtime *rt)
{
    if (!rt)
        return core_fail(KEEL_EINVAL, "keel_runtime_step: runtime is NULL");
    if (atomic_load(&rt->driver_running))
        return core_fail(KEEL_EBUSY, "keel_runtime_step: the tick driver is running");
    return runtime_step(rt);
}

/* ---- inside a system ------------------------------------------------------------ */

keel_world *keel_ctx_world(keel_ctx *ctx)
{
    return ctx ? ctx->rt->world : NULL;
}

uint64_t keel_ctx_tick(const keel_ctx *ctx)
{
    return ctx ? atomic_load_explicit(&ctx->txn->running_tick, memory_order_relaxed) : 0;
}

float keel_ctx_dt(const keel_ctx *ctx)
{
    return ctx ? ctx->rt->dt : 0;
}

uint32_t keel_ctx_worker(const keel_ctx *ctx)
{
    return ctx ? ctx->worker : 0;
}

const char *keel_ctx_system_name(const keel_ctx *ctx)
{
    return ctx ? ctx->name : NULL;
}

keel_cmdbuf *keel_ctx_commands(keel_ctx *ctx)
{
    return ctx ? ctx->cmds : NULL;
}


/* ---- the transaction layer's public entry points ---------------------------------- */

int keel_submit(keel_runtime *rt, keel_submit_fn fn, void *arg, keel_durability mode, keel_ticket **out)
{
    if (!rt)
        return core_fail(KEEL_EINVAL, "keel_submit: runtime or closure is NULL");
    return submit_enqueue(&rt->txn, fn, arg, mode, out);
}

int keel_view_begin(keel_runtime *rt, const keel_view **out)
{
    if (!rt || !out)
        return core_fail(KEEL_EINVAL, "keel_view_begin: runtime or out is NULL");
    return view_begin(&rt->txn, out);
}
