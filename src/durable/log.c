/*
 * durable/log.c -- the transaction layer's logging interface (txn_log_ops
 * in txn/txn_internal.h), implemented on a dur_state. runtime/ installs it
 * in the txn_state when a data directory opens, so txn/ logs side commits
 * and waits for durability without knowing this layer.
 */
#include "durable/durable_internal.h"

static int log_side(void *self, uint64_t seq, keel_durability mode, uint64_t tick, size_t side_off, uint64_t *lsn)
{
    return fence_side(self, seq, mode, tick, side_off, lsn);
}

static int side_fits(void *self, size_t bytes)
{
    return dur_side_fits(self, bytes);
}

static uint64_t last_lsn(void *self)
{
    return dur_last_lsn(self);
}

static int sync_request(void *self, uint64_t lsn)
{
    return dur_sync_request(self, lsn);
}

static int wait_durable(void *self, uint64_t lsn, bool flush, int64_t timeout_ns)
{
    return dur_wait_timed(self, lsn, flush, timeout_ns);
}

static void when_durable(void *self, uint64_t lsn, void (*done)(void *arg, int rc), void *arg)
{
    dur_when_durable(self, lsn, done, arg);
}

static void latch_fatal(void *self, int rc)
{
    dur_latch_fatal(self, rc);
}

static int fatal(void *self)
{
    return dur_fatal(self);
}

static bool pin_hold(void *self, void *buf)
{
    return dur_pin_hold(self, buf);
}

static bool pin_active(void *self)
{
    return dur_pin_active(self);
}

const txn_log_ops dur_txn_log = {
    .log_side = log_side,
    .side_fits = side_fits,
    .last_lsn = last_lsn,
    .sync_request = sync_request,
    .wait_durable = wait_durable,
    .when_durable = when_durable,
    .latch_fatal = latch_fatal,
    .fatal = fatal,
    .pin_hold = pin_hold,
    .pin_active = pin_active,
};
