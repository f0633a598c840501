/*
 * keel/command.h -- deferred structural changes.
 *
 * Spawn, destroy, add and remove are recorded into a command buffer and
 * applied later, at a sync point, one at a time in FIFO order. Semantics
 * (docs/world.md, "Deferred commands", has the full table):
 *
 *  - A spawn gives no handle when recorded; after playback the handles of the
 *    created entities are available as receipts, in command order.
 *  - Destroy A then spawn B may reuse A's slot (with a new generation); spawn
 *    then destroy cannot, because the slot is still live when B is created.
 *  - A destroy, add or remove whose target is null, stale or foreign is
 *    ignored and counted (ignored_null / ignored_stale). A second destroy of
 *    one entity targets a stale handle and is counted likewise. The slot's
 *    current occupant is never touched.
 *  - add of a component the entity already has overwrites its value (and
 *    counts in `added`); remove
 *    of a component the entity lacks is ignored and counted (ignored_absent).
 *  - Failure policy: a command is removed from the buffer only after it was
 *    applied. When one fails (no slot left, out of memory), playback stops:
 *    the applied prefix and its receipts stay, the failed command and the
 *    suffix stay queued and the buffer is "pending". keel_cmdbuf_apply again
 *    retries exactly the pending commands; keel_cmdbuf_discard drops them.
 *    While a buffer is pending it refuses new commands (KEEL_EBUSY) and the
 *    world reports it in keel_world_pending(), which a tick refuses to start on.
 *
 * Values are copied when a command is recorded: the caller's buffers may be
 * reused at once.
 *
 * Thread-safety: a buffer is used by one thread at a time. Recording does not
 * touch the world (it only checks component ids against the registry, which
 * is frozen while systems run); playback needs exclusive access to the world.
 */
#ifndef KEEL_COMMAND_H
#define KEEL_COMMAND_H

#include <stdint.h>

#include "keel/component.h"
#include "keel/entity.h"
#include "keel/world.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct keel_cmdbuf keel_cmdbuf;

/* An initial value for a spawn: component c, size bytes at value (NULL =
 * zero-filled; must be NULL or ignored for tags). */
typedef struct keel_init {
    keel_component c;
    const void *value;
} keel_init;

/* What playback did since the last keel_cmdbuf_reset. */
typedef struct keel_cmd_result {
    const keel_entity *created;  /* receipts: handles of spawned entities, in command order */
    uint32_t created_count;
    uint32_t spawned, destroyed, added, removed;
    uint32_t ignored_null;       /* target was KEEL_ENTITY_NULL */
    uint32_t ignored_stale;      /* target stale (incl. a second destroy) or foreign */
    uint32_t ignored_absent;     /* remove of a component the entity lacks */
    uint32_t pending;            /* commands still queued (recorded, not applied) */
} keel_cmd_result;

/* Errors: KEEL_EINVAL (NULL w), KEEL_ENOMEM. */
int keel_cmdbuf_create(keel_world *w, keel_cmdbuf **out);
/* NULL is ignored. Pending commands are dropped (and the world stops counting
 * the buffer as pending). */
void keel_cmdbuf_destroy(keel_cmdbuf *cb);

/* Record a spawn with n initial values (n may be 0: an entity without
 * components). Errors: KEEL_EINVAL (unknown or repeated component, NULL
 * inits with n > 0, n > KEEL_MAX_COMPONENTS), KEEL_EBUSY (buffer pending),
 * KEEL_ENOMEM. Nothing is recorded on error. */
int keel_cmd_spawn(keel_cmdbuf *cb, const keel_init *inits, uint32_t n);
/* Record a destroy. Errors: KEEL_EBUSY, KEEL_ENOMEM. (Bad handles are not an
 * error here: they are ignored and counted at playback.) */
int keel_cmd_destroy(keel_cmdbuf *cb, keel_entity e);
/* Record adding component c with value (NULL = zero-filled) to e.
 * Errors: KEEL_EINVAL (unknown c), KEEL_EBUSY, KEEL_ENOMEM. */
int keel_cmd_add(keel_cmdbuf *cb, keel_entity e, keel_component c, const void *value);
/* Record removing component c from e. Errors: KEEL_EINVAL, KEEL_EBUSY, KEEL_ENOMEM. */
int keel_cmd_remove(keel_cmdbuf *cb, keel_entity e, keel_component c);

/* Apply the queued commands to the buffer's world, FIFO, one at a time.
 * Returns 0 when every queued command was applied (or ignored and counted).
 * On failure returns the failing command's code (KEEL_ENOSPC, KEEL_ENOMEM)
 * with a last error naming the command (its 1-based position counted from the
 * last reset, and its kind) and leaves the
 * buffer pending as described above. */
int keel_cmdbuf_apply(keel_cmdbuf *cb);

/* Drop the queued commands without applying them; receipts and counters of
 * what was applied stay. Clears the pending state. Cannot fail. */
void keel_cmdbuf_discard(keel_cmdbuf *cb);

/* Clear receipts and counters to start a new round.
 * Errors: KEEL_EBUSY when commands are still queued (apply or discard first). */
int keel_cmdbuf_reset(keel_cmdbuf *cb);

/* Receipts and counters. The pointer inside stays valid until the next
 * apply, reset or destroy. NULL gives an all-zero result. */
keel_cmd_result keel_cmdbuf_result(const keel_cmdbuf *cb);

#ifdef __cplusplus
}
#endif
#endif
