/*
 * keel/txn.h -- transactions (docs/transactions.md has the rules).
 *
 * System transactions. Every callback or query system runs inside a
 * transaction the scheduler opens on the worker running it. Its writes to
 * VERSIONED components go to private copy-on-write versions of the chunks it
 * touches and become visible, all at once, when the system succeeds; a
 * failing system (error return, keel_txn_fail) leaves no VERSIONED write and
 * no command behind. SINGLE_VERSION and TRANSIENT writes are made in place
 * and are never rolled back. User code never commits a system transaction.
 *
 * Side transactions (economy). Opened inside a system, or run for a closure
 * submitted from any thread: they read committed values, record the row
 * versions they read, and commit on their own -- validated (KEEL_ECONFLICT
 * when a row they read was changed by another side transaction since; then
 * nothing is applied), durable per their mode, and kept even when the
 * enclosing system fails.
 */
#ifndef KEEL_TXN_H
#define KEEL_TXN_H

#include <stdint.h>

#include "keel/component.h"
#include "keel/durability.h"
#include "keel/entity.h"
#include "keel/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the system transaction ---------------------------------------------- */

/* Read e's component c as this system sees it: its own uncommitted writes
 * first; else the tick-start value when the system declares
 * reads_snapshot(c); else the committed value.
 * Errors: KEEL_EINVAL (NULL ctx/out, a pipeline system, or c not declared in
 * any access list of the system), KEEL_ESTALE, KEEL_ENOENT (e lacks c). */
int keel_txn_get(keel_ctx *ctx, keel_entity e, keel_component c, void *out);

/* Write e's component c in the system transaction (copy-on-write for
 * VERSIONED, in place otherwise). The system must declare writes(c) or
 * rewrites(c); side_writes(c) alone means "only through side transactions".
 * Errors: as keel_txn_get, and KEEL_ENOMEM (copying the chunk failed: the
 * system then fails). Nothing changes on error. */
int keel_txn_set(keel_ctx *ctx, keel_entity e, keel_component c, const void *value);

/* Iterate query q in a callback system's transaction (or on_first_tick's):
 * as keel_query_iter / keel_iter_next, but every chunk's columns are what
 * the system may see: a private copy-on-write version for the VERSIONED
 * components it writes (it.prev[i] as described in keel/query.h for the ones
 * it rewrites), the tick-start version for those it reads_snapshot, the
 * committed version otherwise. keel_txn_next returns false at the end, or
 * when a private version could not be allocated: the system then fails with
 * KEEL_ENOMEM (as if keel_txn_fail was called) and should return. */
void keel_txn_iter(keel_ctx *ctx, const keel_query *q, keel_iter *it);
bool keel_txn_next(keel_ctx *ctx, keel_iter *it);

/* Fail the running system: as if its body returned rc (KEEL_EINVAL when rc
 * is 0). The body should return right after. */
void keel_txn_fail(keel_ctx *ctx, int rc);

/* ---- side transactions ----------------------------------------------------- */

typedef struct keel_side_txn keel_side_txn;

/* Open a side transaction in the running system. It must be committed or
 * aborted before the body returns (one still open then is aborted).
 * Errors: KEEL_EINVAL (NULL, a bad mode, a hook or pipeline), KEEL_ENOMEM. */
int keel_side_txn_begin(keel_ctx *ctx, keel_durability mode, keel_side_txn **out);

/* Read a committed value (or this transaction's own write) and record the
 * row's version for validation at commit. The component must be one the
 * system declares (any access list). Errors: KEEL_EINVAL, KEEL_ESTALE,
 * KEEL_ENOENT, KEEL_ENOMEM. */
int keel_side_get(keel_side_txn *tx, keel_entity e, keel_component c, void *out);

/* Buffer a write; applied at commit. The component must be declared
 * writes/rewrites/side_writes by the system (KEEL_EINVAL otherwise) and not
 * TRANSIENT. Errors: KEEL_EINVAL, KEEL_ESTALE, KEEL_ENOENT, KEEL_ENOMEM. */
int keel_side_set(keel_side_txn *tx, keel_entity e, keel_component c, const void *value);

/* Validate, apply, wait for durability per mode, and end the transaction
 * (tx is freed whatever the outcome). 0, or KEEL_ECONFLICT (a row read has a
 * newer version, or an entity written was destroyed: nothing applied),
 * KEEL_ENOMEM (nothing applied), KEEL_EFATAL (the runtime cannot make it
 * durable), KEEL_EALREADY (its idempotency key committed before, within the
 * window: nothing applied; keel_side_txn_set_key). Committed writes are visible to the rest of the system at once
 * and stay even if the system later fails. A transaction that wrote nothing
 * is validated the same way and logs nothing; IMMEDIATE, it returns once
 * everything logged before its commit is durable (at once when it is). */
int keel_side_txn_commit(keel_side_txn *tx);

/* keel_side_txn_commit, and *lsn receives the commit's WAL LSN (0 when
 * nothing was logged: a read-only transaction without a key, no data
 * directory, or an error; KEEL_EALREADY: the LSN of the record holding the
 * key, 0 when this runtime read that record from disk or from its stream)
 * -- keel_wait_durable(rt, lsn, ...) waits for it.
 * Errors: those of keel_side_txn_commit; KEEL_EINVAL when lsn is NULL (tx
 * is aborted). Thread-safe as keel_side_txn_commit. */
int keel_side_txn_commit_lsn(keel_side_txn *tx, uint64_t *lsn);

/* Give the transaction an idempotency key (0 = none; the last call before
 * the commit counts). keel remembers which keys committed -- durably with a
 * data directory, across recovery and checkpoints, else in memory -- for
 * keel_durable_desc.idempotency_window_ticks ticks; committing a key that
 * committed within that window applies nothing and returns KEEL_EALREADY
 * (the last error names the key), whatever the transaction read or wrote.
 * Two concurrent commits of one key apply exactly once. KEEL_EALREADY is
 * acknowledged as the commit holding the key is, per the mode: IMMEDIATE
 * once that commit's record is durable, KEEL_EFATAL if it never is.
 * A keyed transaction that wrote nothing still logs a record: its key.
 * Errors: KEEL_EINVAL (tx NULL). Call it on the thread that owns tx. */
int keel_side_txn_set_key(keel_side_txn *tx, uint64_t key);

/* Drop the transaction and its buffered writes. NULL is ignored. */
void keel_side_txn_abort(keel_side_txn *tx);

typedef struct keel_ticket keel_ticket;

/* Commit like keel_side_txn_commit, but do not wait for durability: on
 * success *out receives a ticket (release it with keel_ticket_release)
 * that completes when the commit is durable per its mode (IMMEDIATE:
 * synced) -- with 0, or KEEL_EFATAL (or KEEL_EUNAVAILABLE: see
 * keel_ticket_wait). Several commits made back to back and then waited for
 * share one group commit (one sync) instead of one sync each; tell the
 * player "done" when the ticket completes. The writes
 * are visible at once, as with keel_side_txn_commit. A key that committed
 * before gives a ticket that completes with KEEL_EALREADY once that commit
 * is acknowledged per the mode. Errors (no ticket; tx freed): those of
 * keel_side_txn_commit but KEEL_EALREADY, and KEEL_ENOMEM. */
int keel_side_txn_commit_async(keel_side_txn *tx, keel_ticket **out);

/* ---- submission from other threads ----------------------------------------- */

/* A closure run in its own side transaction (full access to every durable
 * component): return 0 to commit, non-zero to abort with that result. */
typedef int (*keel_submit_fn)(keel_side_txn *tx, void *arg);

/* Queue fn(tx, arg) for the start of the next tick (Engine-Pre, serial, in
 * submission order). Thread-safe, lock-free, never blocks. *out (may be NULL
 * for fire-and-forget) receives a ticket to wait on and release.
 * Errors: KEEL_EINVAL (NULL rt or fn, bad mode), KEEL_ENOMEM, KEEL_EFATAL
 * (the runtime latched fatal: no tick will run it). */
int keel_submit(keel_runtime *rt, keel_submit_fn fn, void *arg, keel_durability mode, keel_ticket **out);

/* Wait until the closure ran and its commit is durable per its mode (or,
 * for a ticket of keel_side_txn_commit_async, until that commit is); returns
 * its result: 0, the closure's own non-zero return, a commit error
 * (KEEL_ECONFLICT, KEEL_EALREADY, KEEL_EFATAL ...), KEEL_EBUSY when the runtime closed
 * before running it, or KEEL_EFATAL when it latched fatal before running it
 * (the ticket completes at the next keel_runtime_step attempt or at close).
 * timeout_ns < 0 waits for ever; on timeout returns KEEL_ETIMEDOUT (also
 * when what it waits for is on the local disk but not yet on a `sync`
 * replication stream: the ticket is pending) and the ticket stays valid.
 * An IMMEDIATE ticket whose record a `sync` primary's close left on the
 * local disk only (keel_runtime_close returned KEEL_EUNAVAILABLE) completes
 * with KEEL_EUNAVAILABLE; one whose record never became durable because
 * the runtime latched, with KEEL_EFATAL. Thread-safe. */
int keel_ticket_wait(keel_ticket *t, int64_t timeout_ns);

/* The LSN of the ticket's commit record once it committed; 0 before that,
 * when nothing was logged (read-only, no data directory) or when it
 * failed. Thread-safe. */
uint64_t keel_ticket_lsn(const keel_ticket *t);

/* Wait until the ticket completed (as keel_ticket_wait) and its record is
 * synced to disk, whatever its mode: an IMMEDIATE ticket completes only
 * then anyway; for GROUP and DEFERRED it asks the WAL writer to sync now
 * (held DEFERRED records included) rather than waiting for its window.
 * Returns keel_ticket_wait's result when that is not 0 or KEEL_EALREADY,
 * else that result once durable (at once when nothing was logged; for
 * KEEL_EALREADY, once everything logged before it is), KEEL_EFATAL when the
 * runtime latched before the record was durable, KEEL_EUNAVAILABLE when a
 * `sync` primary's close left it on the local disk only, KEEL_ETIMEDOUT after
 * timeout_ns (< 0 = for ever; the ticket stays valid). Thread-safe; call it before
 * keel_runtime_close returns or after (close makes every record durable),
 * not while close runs. */
int keel_ticket_wait_durable(keel_ticket *t, int64_t timeout_ns);

/* Give the ticket back (after or instead of waiting). NULL is ignored. */
void keel_ticket_release(keel_ticket *t);

#ifdef __cplusplus
}
#endif
#endif
