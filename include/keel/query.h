/*
 * keel/query.h -- queries: the entities that have every `with` component and
 * none of the `without` components, visited chunk by chunk.
 *
 * A query keeps the list of matching archetype tables up to date as new
 * tables appear, so creating one is a setup-time cost and iterating is a walk
 * over (table, chunk) pairs. Order is deterministic: tables in creation
 * order, chunks in row order.
 *
 * Thread-safety: iteration only reads the world; several iterators may walk
 * one query at once. Iterators are invalidated by structural changes (command
 * playback), which never happen inside a tick's systems.
 */
#ifndef KEEL_QUERY_H
#define KEEL_QUERY_H

#include <stdbool.h>
#include <stdint.h>

#include "keel/component.h"
#include "keel/entity.h"
#include "keel/world.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KEEL_QUERY_MAX_TERMS 16

typedef struct keel_query keel_query;

typedef struct keel_query_desc {
    /* Components an entity must have; the list ends at the first 0. At least
     * one is required. Column i of an iterator belongs to with[i]. */
    keel_component with[KEEL_QUERY_MAX_TERMS];
    /* Components an entity must not have; ends at the first 0. */
    keel_component without[KEEL_QUERY_MAX_TERMS];
} keel_query_desc;

/* Errors: KEEL_EINVAL (no with term, unknown id, a component both in with
 * and without or twice in one list), KEEL_ENOMEM. */
int keel_query_create(keel_world *w, const keel_query_desc *desc, keel_query **out);
/* NULL is ignored. */
void keel_query_destroy(keel_query *q);

/* Number of matching entities (sums the matching tables' row counts). */
uint32_t keel_query_count(const keel_query *q);

/* One chunk of matching rows. The public fields are valid after
 * keel_iter_next returned true and until the next call. */
typedef struct keel_iter {
    uint32_t count;                          /* rows in this chunk (>= 1); in a system with an
                                                entity_budget, possibly part of a chunk */
    const keel_entity *entities;             /* count handles */
    void *columns[KEEL_QUERY_MAX_TERMS];     /* column i: count values of with[i]; NULL for tags */
    /* The values before this system's writes: equal to columns[i] except for
     * a column the system `rewrites` (keel/schedule.h), where columns[i] is
     * a fresh version to fill and prev[i] holds the current values. */
    const void *prev[KEEL_QUERY_MAX_TERMS];
    /* private */
    const keel_query *query_;
    uint32_t table_pos_;
    uint32_t chunk_;
} keel_iter;

/* Start an iteration (no allocation, cannot fail). */
void keel_query_iter(const keel_query *q, keel_iter *it);
/* Advance to the next non-empty chunk; false at the end. */
bool keel_iter_next(keel_iter *it);

#define KEEL_COLUMN(it, type, i) ((type *)(it)->columns[(i)])

#ifdef __cplusplus
}
#endif
#endif
