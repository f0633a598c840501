/*
 * runtime/durability.c -- the public durability calls (keel/durability.h):
 * opening the data directory (durable/) into the runtime's world and
 * installing durable/'s logging interface in the transaction layer.
 */
#include <stdio.h>
#include "core/core.h"
#include "core/failpoint.h"
#include "runtime/runtime_internal.h"

/* Open and recover the data directory; on success the transaction layer
 * logs through it from now on. */
static int open_data_dir(keel_runtime *rt)
{
    dur_open_desc o = {
        .dir = rt->data_dir,
        .desc = &rt->durable_desc,
        .mode = rt->txn.durability,
        .world = rt->world,
        .txn = &rt->txn,
        .pool = dispatch_pool(&rt->ex),
    };
    int rc = repl_before_open(rt, &o);
    if (!rc) {
        rc = dur_open(&o, &rt->dur, &rt->recovery);
        repl_loaded(rt, rc);
    }
    if (!rc) {
        atomic_store(&rt->tick, rt->recovery.tick);
        /* between ticks, side commits (on_shutdown) belong to the last tick
         * that ran: the recovered one until the first step */
        atomic_store_explicit(&rt->txn.running_tick, rt->recovery.tick, memory_order_relaxed);
        rt->txn.log = (txn_log){&dur_txn_log, rt->dur};
        rc = view_publish(&rt->txn, rt->recovery.tick); /* readers see the recovered state at once */
    }
    if (!rc)
        rc = repl_after_open(rt);
    if (!rc)
        metrics_publish(rt, true);
    return rc;
}

void runtime_close_data_dir(keel_runtime *rt)
{
    runtime_fence_join(rt);
    if (rt->dur)
        (void)repl_close(rt, true, NULL); /* no-op after shutdown_durable's */
    rt->txn.log = (txn_log){0};
    metrics_forget_dur(rt);
    dur_close(rt->dur);
    rt->dur = NULL;
}

int keel_runtime_recover(keel_runtime *rt, keel_recovery *out)
{
    if (!rt)
        return core_fail(KEEL_EINVAL, "keel_runtime_recover: runtime is NULL");
    if (!rt->data_dir)
        return core_fail(KEEL_EINVAL, "keel_runtime_recover: the runtime has no data directory (durable.dir)");
    if (!rt->recovered) {
        if (atomic_load(&rt->tick) || atomic_load(&rt->driver_running))
            return core_fail(KEEL_EBUSY, "keel_runtime_recover: ticks already ran in memory");
        rt->recovered = true;
        keel_world_freeze(rt->world); /* the schema is checked and stored now: no later registration */
        rt->recover_rc = open_data_dir(rt);
        if (rt->recover_rc) {
            core_fail_prefix(rt->recover_rc, "cannot open data directory %s", rt->data_dir);
            snprintf(rt->recover_error, sizeof rt->recover_error, "%s", keel_last_error());
            /* a directory this open made, refused (a replica's stream that is no world of its schema, say):
               nothing of it stays (kw_store_forget acts only on what the store itself made) */
            if (rt->dur)
                kw_store_forget(rt->dur->store);
            runtime_close_data_dir(rt);
            core_fail(rt->recover_rc, "%s", rt->recover_error); /* closing may have set another */
        } else {
            (void)KEEL_FAILPOINT(RECOVER_AFTER_REPLAY); /* recovered, before on_first_tick and any tick */
        }
    } else if (rt->recover_rc) {
        core_fail(rt->recover_rc, "%s", rt->recover_error);
    }
    if (out)
        *out = rt->recovery;
    return rt->recover_rc;
}

int keel_flush(keel_runtime *rt)
{
    if (!rt)
        return core_fail(KEEL_EINVAL, "keel_flush: runtime is NULL");
    if (!rt->dur)
        return rt->data_dir && rt->recover_rc ? core_fail(KEEL_EFATAL, "keel_flush: the data directory is not open")
                                               : KEEL_OK;
    return dur_wait(rt->dur, dur_last_lsn(rt->dur), true);
}

int keel_checkpoint(keel_runtime *rt)
{
    if (!rt || !rt->data_dir)
        return core_fail(KEEL_EINVAL, "keel_checkpoint: %s", rt ? "the runtime has no data directory" : "runtime is NULL");
    if (atomic_load(&rt->driver_running))
        return core_fail(KEEL_EBUSY, "keel_checkpoint: the tick driver is running; stop it first");
    int rc = keel_runtime_recover(rt, NULL);
    if (!rc)
        rc = repl_settle(rt); /* a replica's checkpoint goes into a directory that holds its bootstrap */
    if (rc)
        return rc;
    if (dur_fatal(rt->dur))
        return core_fail(KEEL_EFATAL, "keel_checkpoint: the runtime latched fatal (%s)", keel_strerror(dur_fatal(rt->dur)));
    if (rt->world->mutations != rt->txn.pub_mutations && (rc = view_publish(&rt->txn, atomic_load(&rt->tick))))
        return rc;
    rc = ckpt_maybe(rt->dur, atomic_load(&rt->tick), true);
    return rc ? rc : ckpt_wait(rt->dur);
}

int keel_runtime_fatal(const keel_runtime *rt)
{
    return rt ? dur_fatal(rt->dur) : 0;
}

uint64_t keel_durable_lsn(const keel_runtime *rt)
{
    return rt && rt->dur ? atomic_load_explicit(&((dur_state *)rt->dur)->durable_lsn, memory_order_acquire) : 0;
}

int keel_wait_durable(keel_runtime *rt, uint64_t lsn, int64_t timeout_ns)
{
    if (!rt)
        return core_fail(KEEL_EINVAL, "keel_wait_durable: runtime is NULL");
    if (!lsn || !rt->data_dir)
        return KEEL_OK;
    if (!rt->dur)
        return core_fail(KEEL_EINVAL, "keel_wait_durable: LSN %llu was never handed out: the data directory %s is "
                                      "not open", (unsigned long long)lsn, rt->data_dir);
    dur_state *d = rt->dur;
    uint64_t last = dur_last_lsn(d);
    if (lsn > last)
        return core_fail(KEEL_EINVAL, "keel_wait_durable: LSN %llu was never handed out (the last is %llu)",
                         (unsigned long long)lsn, (unsigned long long)last);
    if (atomic_load_explicit(&d->durable_lsn, memory_order_acquire) >= lsn)
        return KEEL_OK; /* on disk, latched or not */
    return dur_wait_timed(d, lsn, true, timeout_ns);
}

uint64_t keel_runtime_tick_lsn(const keel_runtime *rt)
{
    return rt && rt->dur ? atomic_load_explicit(&((dur_state *)rt->dur)->tick_lsn, memory_order_acquire) : 0;
}
