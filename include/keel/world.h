/*
 * keel/world.h -- the world: entity slots, registered component types and
 * their chunked columnar storage.
 *
 * Thread-safety: a world is not internally locked. Calls that change it
 * (registration, keel_set, command playback) need exclusive access; calls
 * that only read it (keel_get, keel_alive, queries, keel_world_hash) may run
 * concurrently with each other. The runtime layered on top provides the
 * scheduling that makes this safe; a bare world is for one thread at a time.
 *
 * Structural changes (spawn, destroy, add, remove) are never made directly:
 * they are recorded into a command buffer (keel/command.h) and applied at a
 * sync point, so iteration never sees membership change under it.
 */
#ifndef KEEL_WORLD_H
#define KEEL_WORLD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keel/component.h"
#include "keel/entity.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct keel_world keel_world;

typedef struct keel_world_desc {
    uint32_t chunk_rows;    /* rows per storage chunk: power of two in [16, 65536]; 0 = 8192 */
    uint32_t max_entities;  /* live entity limit; 0 = 2^32 - 2 (every index a handle can hold) */
} keel_world_desc;

/* Create an empty world. desc may be NULL (all defaults).
 * Errors: KEEL_EINVAL (bad desc field), KEEL_ENOMEM. *out is set only on success. */
int keel_world_create(const keel_world_desc *desc, keel_world **out);

/* Free the world and everything in it. NULL is ignored. Command buffers and
 * queries created on the world must be destroyed first. */
void keel_world_destroy(keel_world *w);

/* Register a component type; *out receives its id (1, 2, ... in registration
 * order). The descriptor and its strings are copied.
 * Errors: KEEL_EINVAL (bad name, size, alignment, discipline or schema: the
 * last error names the component and field), KEEL_EEXIST (name taken),
 * KEEL_ERANGE (more than KEEL_MAX_COMPONENTS), KEEL_EBUSY (registration
 * closed, see keel_world_freeze), KEEL_ENOMEM. Nothing changes on error. */
int keel_component_register(keel_world *w, const keel_component_desc *desc, keel_component *out);

/* Id of the component called name. Errors: KEEL_EINVAL (NULL), KEEL_ENOENT. */
int keel_component_lookup(const keel_world *w, const char *name, keel_component *out);

/* The stored descriptor of component c (strings owned by the world), or NULL
 * when c is not a registered id. Defaults are resolved: `align` holds the
 * alignment in force and every field's `count` is at least 1. */
const keel_component_desc *keel_component_info(const keel_world *w, keel_component c);

/* Number of registered component types. */
uint32_t keel_component_count(const keel_world *w);

/* Close registration (the runtime calls this before the first tick).
 * Later keel_component_register calls fail with KEEL_EBUSY. Idempotent. */
void keel_world_freeze(keel_world *w);

/* ---- entities and values ------------------------------------------------ */

/* True when e names a live entity of this world. */
bool keel_alive(const keel_world *w, keel_entity e);

/* Number of live entities. */
uint32_t keel_world_count(const keel_world *w);

/* 1 when the live entity e has component c, 0 when it lacks it.
 * Errors: KEEL_ESTALE (null/stale/foreign e), KEEL_EINVAL (unknown c). */
int keel_has(const keel_world *w, keel_entity e, keel_component c);

/* Copy the value of component c of entity e into out (size bytes of c).
 * Errors: KEEL_ESTALE, KEEL_EINVAL (unknown c, NULL out), KEEL_ENOENT (e lacks c). */
int keel_get(const keel_world *w, keel_entity e, keel_component c, void *out);

/* Overwrite the value of component c of entity e with size bytes from value.
 * Errors: as keel_get. Nothing changes on error. */
int keel_set(keel_world *w, keel_entity e, keel_component c, const void *value);

/* ---- state hash ---------------------------------------------------------
 * A 64-bit hash of the whole durable state, in a canonical order:
 *   the number of entity slots ever used;
 *   for each slot in index order: its generation and whether it is live;
 *   for each live slot: for each of its components in id order that is not
 *   TRANSIENT: the component id and the value's bytes (all `size` bytes,
 *   padding included -- keep padding zeroed; the world zero-fills new rows).
 * It does not depend on where rows sit in storage (archetype, chunk, row),
 * so two worlds holding the same (handle, values) set hash alike whatever
 * sequence of spawns, moves and destroys produced them. Tags (size 0) count
 * by their id. Read-only; see the thread-safety note above. */
uint64_t keel_world_hash(const keel_world *w);

/* Number of command buffers holding commands whose playback failed and that
 * were neither retried to completion nor discarded (keel/command.h). A tick
 * must not start while this is non-zero. */
uint32_t keel_world_pending(const keel_world *w);

#ifdef __cplusplus
}
#endif
#endif
