/*
 * txn/submit.c -- closures submitted from any thread, run at the next tick
 * start in their own side transactions, and the tickets their submitters
 * wait on.
 *
 * Queue: a liburcu wait-free concurrent queue (wfcqueue). Producers
 * (keel_submit, any thread) enqueue wait-free; the single consumer is the
 * stepping thread at Engine-Pre, which first splices the whole queue into a
 * local one -- so closures submitted while it runs wait for the next tick
 * instead of starving this one -- then runs them in order.
 *
 * Ticket: `state` goes 0 (queued) -> 1 (done: committed and durable per
 * its mode) -> 2 (its record is durable), or straight to 2 when there is
 * nothing more to wait for (an IMMEDIATE commit, nothing logged, an
 * error), each step a release exchange after `result` / `durable_rc` and
 * `lsn` are written; waiters load it with acquire and sleep on it as a
 * futex. A waiter sets TICKET_WAITER in the word (CAS) before it sleeps,
 * and sleeps only on the word with the flag; a step replaces the whole
 * word (the flag goes) and wakes only when the word it replaced had the
 * flag. Either the waiter's CAS or futex_wait sees the step (the word
 * changed), or the step sees the flag: no wake-up is lost, and a step
 * nobody waits for makes no system call (at 10^5 tickets a second, the
 * writer's thread had spent more in FUTEX_WAKE than in its commits; a
 * waiter that timed out leaves its flag, and the next step makes one
 * call for nobody). A GROUP or DEFERRED ticket that someone still holds
 * takes its last step from the log's when_durable callback, which holds
 * the queue's reference until then. `refs` counts the submitter's handle
 * and the queue's; the last release frees the ticket. wfcqueue is not
 * visible to ThreadSanitizer, so the producer releases and the consumer
 * acquires the ticket under TSan.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "txn/txn_internal.h"

struct keel_ticket {
    struct cds_wfcq_node node;
    keel_submit_fn fn;
    void *arg;
    keel_durability mode;
    txn_state *ts;             /* keel_ticket_wait_durable asks its log for a sync */
    int result;
    int durable_rc;            /* state 2: 0, or why its record never became durable: KEEL_EFATAL (the
                                  runtime latched), KEEL_EUNAVAILABLE (a sync primary closed first) */
    _Atomic uint64_t lsn;      /* the commit's record; 0 until committed, or when nothing was logged */
    _Atomic uint64_t durable_lsn; /* what it waits for to be durable: IMMEDIATE, what the commit waits
                                  for; else its record; KEEL_EALREADY: the commit holding the key */
    _Atomic uint32_t state;    /* 0 queued, 1 done, 2 done and durable */
    _Atomic uint32_t refs;
};

enum { TICKET_QUEUED = 0, TICKET_DONE = 1, TICKET_DURABLE = 2 };
#define TICKET_WAITER 0x80000000u /* in `state`: someone sleeps on it (see the top) */

int submit_init(txn_state *ts)
{
    cds_wfcq_init(&ts->submit_head, &ts->submit_tail);
    return KEEL_OK;
}

static void ticket_put(keel_ticket *t)
{
    if (atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) == 1)
        free(t);
}

static void ticket_state(keel_ticket *t, uint32_t state)
{
    if (atomic_exchange_explicit(&t->state, state, memory_order_acq_rel) & TICKET_WAITER)
        syscall(SYS_futex, (uint32_t *)&t->state, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* The ticket's state, without the waiter flag. */
static uint32_t ticket_state_now(keel_ticket *t)
{
    return atomic_load_explicit(&t->state, memory_order_acquire) & ~TICKET_WAITER;
}

/* Done with nothing more to wait for (also its record's durability). */
static void ticket_complete(keel_ticket *t, int result)
{
    t->result = result;
    ticket_state(t, TICKET_DURABLE);
    ticket_put(t);
}

int submit_enqueue(txn_state *ts, keel_submit_fn fn, void *arg, keel_durability mode, keel_ticket **out)
{
    if (!fn)
        return core_fail(KEEL_EINVAL, "keel_submit: closure is NULL");
    if (mode < KEEL_DURABLE_DEFAULT || mode > KEEL_DURABLE_DEFERRED)
        return core_fail(KEEL_EINVAL, "keel_submit: durability mode %d is not a keel_durability", (int)mode);
    if (ts->log.ops && txn_log_fatal(&ts->log)) /* it would never run: no step runs after the latch */
        return core_fail(KEEL_EFATAL, "keel_submit: the runtime latched fatal (%s); nothing more is run or made "
                                      "durable", keel_strerror(txn_log_fatal(&ts->log)));
    keel_ticket *t = malloc(sizeof *t);
    if (!t)
        return core_fail(KEEL_ENOMEM, "keel_submit: out of memory");
    cds_wfcq_node_init(&t->node);
    t->fn = fn;
    t->arg = arg;
    t->mode = mode;
    t->ts = ts;
    t->result = t->durable_rc = 0;
    atomic_init(&t->durable_lsn, 0);
    atomic_init(&t->lsn, 0);
    atomic_init(&t->state, TICKET_QUEUED);
    atomic_init(&t->refs, out ? 2 : 1);
    if (out)
        *out = t;
    CORE_TSAN_RELEASE(t);
    cds_wfcq_enqueue(&ts->submit_head, &ts->submit_tail, &t->node);
    return KEEL_OK;
}

/* An IMMEDIATE ticket completes when the writer made its record durable
 * (the log's when_durable): closures run back to back, and their records share
 * one group commit instead of one sync each. */
static void ticket_durable(void *arg, int rc)
{
    keel_ticket *t = arg;
    t->durable_rc = rc;
    ticket_complete(t, rc ? rc : t->result);
}

/* A GROUP or DEFERRED ticket completed at commit; this is its record
 * becoming durable (rc 0) or never (its durable_rc). */
static void ticket_record_durable(void *arg, int rc)
{
    keel_ticket *t = arg;
    t->durable_rc = rc;
    ticket_state(t, TICKET_DURABLE);
    ticket_put(t);
}

/* The commit of t's transaction ended with rc (r: what it logged): complete
 * the ticket per its mode, keeping the queue's reference while a step is
 * left for the log. */
static void ticket_committed(txn_state *ts, keel_ticket *t, int rc, const side_result *r)
{
    bool already = rc == KEEL_EALREADY; /* answered as the commit that holds its key: r->wait_lsn */
    if ((rc && !already) || !ts->log.ops || !r->wait_lsn) {
        ticket_complete(t, rc);
        return;
    }
    atomic_store_explicit(&t->lsn, r->lsn, memory_order_release);
    t->result = rc;
    bool immediate = r->mode == KEEL_DURABLE_IMMEDIATE;
    uint64_t durable = already || immediate ? r->wait_lsn : r->lsn;
    atomic_store_explicit(&t->durable_lsn, durable, memory_order_release);
    if (immediate) {
        ts->log.ops->when_durable(ts->log.self, durable, ticket_durable, t);
        return;
    }
    if (!durable || atomic_load_explicit(&t->refs, memory_order_acquire) < 2) {
        ticket_complete(t, rc); /* nothing logged, or nobody left to wait for the record */
        return;
    }
    ticket_state(t, TICKET_DONE);
    ts->log.ops->when_durable(ts->log.self, durable, ticket_record_durable, t);
}

int keel_side_txn_commit_async(keel_side_txn *tx, keel_ticket **out)
{
    if (!out) {
        keel_side_txn_abort(tx);
        return core_fail(KEEL_EINVAL, "keel_side_txn_commit_async: out is NULL");
    }
    keel_ticket *t = calloc(1, sizeof *t);
    if (!t) {
        keel_side_txn_abort(tx);
        return core_fail(KEEL_ENOMEM, "keel_side_txn_commit_async: out of memory");
    }
    txn_state *ts = tx ? side_state(tx) : NULL;
    side_result r;
    int rc = side_commit(tx, &r);
    if (rc && rc != KEEL_EALREADY) {
        free(t);
        return rc;
    }
    t->ts = ts;
    t->mode = r.mode;
    atomic_init(&t->refs, 2);
    *out = t;
    ticket_committed(ts, t, rc, &r); /* KEEL_EALREADY: the ticket's result, once the key's commit is acknowledged */
    return KEEL_OK;
}

static void run_closure(txn_state *ts, keel_ticket *t)
{
    keel_side_txn *tx = NULL;
    side_result r = {0};
    int rc = side_begin_full(ts, t->mode, &tx);
    if (!rc && (rc = t->fn(tx, t->arg)))
        keel_side_txn_abort(tx);
    else if (!rc)
        rc = side_commit(tx, &r);
    ticket_committed(ts, t, rc, &r);
}

/* Take every queued ticket in order; `run` false completes them unrun
 * with `rc`. Only the stepping thread drains (the queue's one consumer). */
static void drain(txn_state *ts, bool run, int rc)
{
    struct cds_wfcq_head head;
    struct cds_wfcq_tail tail;
    cds_wfcq_init(&head, &tail);
    if (cds_wfcq_splice_blocking(&head, &tail, &ts->submit_head, &ts->submit_tail) == CDS_WFCQ_RET_SRC_EMPTY)
        return;
    struct cds_wfcq_node *node;
    while ((node = __cds_wfcq_dequeue_blocking(&head, &tail)) != NULL) {
        keel_ticket *t = caa_container_of(node, keel_ticket, node);
        CORE_TSAN_ACQUIRE(t);
        if (run)
            run_closure(ts, t);
        else
            ticket_complete(t, rc);
    }
}

void submit_run(txn_state *ts)
{
    drain(ts, true, 0);
}

void submit_refuse(txn_state *ts, int rc)
{
    drain(ts, false, rc);
}

void submit_fini(txn_state *ts)
{
    drain(ts, false, KEEL_EBUSY);
    cds_wfcq_destroy(&ts->submit_head, &ts->submit_tail);
}

/* Sleep until t's state reaches `want` or the deadline (timeout_ns < 0:
 * none) passes: true when it did. */
static bool ticket_reach(keel_ticket *t, uint32_t want, int64_t timeout_ns, const struct timespec *deadline)
{
    uint32_t s;
    while (((s = atomic_load_explicit(&t->state, memory_order_acquire)) & ~TICKET_WAITER) < want) {
        struct timespec rel, *relp = NULL;
        if (timeout_ns >= 0) { /* a poll (timeout 0) returns before it flags itself a waiter */
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            int64_t left = (int64_t)(deadline->tv_sec - now.tv_sec) * 1000000000 + (deadline->tv_nsec - now.tv_nsec);
            if (left <= 0)
                return false;
            rel.tv_sec = left / 1000000000;
            rel.tv_nsec = left % 1000000000;
            relp = &rel;
        }
        if (!(s & TICKET_WAITER)) {
            if (!atomic_compare_exchange_weak_explicit(&t->state, &s, s | TICKET_WAITER, memory_order_acq_rel,
                                                       memory_order_acquire))
                continue; /* a step came first (or a spurious failure): look again */
            s |= TICKET_WAITER;
        }
        syscall(SYS_futex, (uint32_t *)&t->state, FUTEX_WAIT_PRIVATE, s, relp, NULL, 0);
    }
    return true;
}

static struct timespec deadline_after(int64_t timeout_ns)
{
    struct timespec deadline = {0};
    if (timeout_ns >= 0) {
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_sec += timeout_ns / 1000000000;
        deadline.tv_nsec += timeout_ns % 1000000000;
        if (deadline.tv_nsec >= 1000000000) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000;
        }
    }
    return deadline;
}

/* fn's answer for a ticket whose record never became durable (state 2). */
static int never_durable(const char *fn, keel_ticket *t)
{
    unsigned long long lsn = atomic_load_explicit(&t->durable_lsn, memory_order_acquire);
    if (t->durable_rc == KEEL_EUNAVAILABLE)
        return core_fail(KEEL_EUNAVAILABLE, "%s: LSN %llu is on the local disk only: the runtime closed before "
                                            "its replication stream acknowledged it", fn, lsn);
    return core_fail(t->durable_rc, "%s: LSN %llu never became durable: the runtime latched fatal", fn, lsn);
}

int keel_ticket_wait(keel_ticket *t, int64_t timeout_ns)
{
    if (!t)
        return core_fail(KEEL_EINVAL, "keel_ticket_wait: ticket is NULL");
    struct timespec deadline = deadline_after(timeout_ns);
    if (!ticket_reach(t, TICKET_DONE, timeout_ns, &deadline)) /* pending, whatever it waits for */
        return core_fail(KEEL_ETIMEDOUT, "keel_ticket_wait: the closure has not completed yet");
    /* a result but 0 and KEEL_EALREADY came with state 2: durable_rc is set (IMMEDIATE: its record's fate) */
    if (t->result && t->result != KEEL_EALREADY && t->durable_rc)
        return never_durable("keel_ticket_wait", t);
    return t->result;
}

uint64_t keel_ticket_lsn(const keel_ticket *t)
{
    return t ? atomic_load_explicit(&((keel_ticket *)t)->lsn, memory_order_acquire) : 0;
}

int keel_ticket_wait_durable(keel_ticket *t, int64_t timeout_ns)
{
    if (!t)
        return core_fail(KEEL_EINVAL, "keel_ticket_wait_durable: ticket is NULL");
    struct timespec deadline = deadline_after(timeout_ns);
    if (!ticket_reach(t, TICKET_DONE, timeout_ns, &deadline))
        return core_fail(KEEL_ETIMEDOUT, "keel_ticket_wait_durable: the closure has not completed yet");
    if (t->result && t->result != KEEL_EALREADY)
        return t->durable_rc ? never_durable("keel_ticket_wait_durable", t) : t->result;
    if (ticket_state_now(t) < TICKET_DURABLE) {
        /* committed, its record not yet synced: GROUP goes out with the
         * writer's next batch, DEFERRED is held -- ask for the sync now (a
         * latch meanwhile completes the ticket with KEEL_EFATAL) */
        txn_state *ts = t->ts;
        uint64_t lsn = atomic_load_explicit(&t->durable_lsn, memory_order_acquire);
        if (ts->log.ops)
            (void)ts->log.ops->sync_request(ts->log.self, lsn);
        if (!ticket_reach(t, TICKET_DURABLE, timeout_ns, &deadline))
            return core_fail(KEEL_ETIMEDOUT, "keel_ticket_wait_durable: LSN %llu is not durable yet",
                             (unsigned long long)lsn);
    }
    if (t->durable_rc)
        return never_durable("keel_ticket_wait_durable", t);
    return t->result;
}

void keel_ticket_release(keel_ticket *t)
{
    if (t)
        ticket_put(t);
}
