/*
 * keel/view.h -- read views: the last completed tick, from any thread.
 *
 * A read view is an RCU read-side section (liburcu, bulletproof flavour: no
 * thread registration needed) over the state the runtime published at the
 * end of its last tick: every VERSIONED component, the entity slots and
 * their handles, consistent with each other. Opening, reading and closing a
 * view never blocks the tick and never waits for it; the versions a view
 * holds are reclaimed after it ends. Views are cheap: open one per request,
 * not one per thread for ever (a view held open keeps its tick's replaced
 * versions alive).
 *
 * SINGLE_VERSION and TRANSIENT components are written in place and are not
 * part of a view (KEEL_EINVAL). End every view before keel_runtime_close.
 */
#ifndef KEEL_VIEW_H
#define KEEL_VIEW_H

#include <stdbool.h>
#include <stdint.h>

#include "keel/component.h"
#include "keel/entity.h"
#include "keel/query.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct keel_runtime keel_runtime; /* keel/runtime.h */

typedef struct keel_view keel_view;

/* Open a view of the last published tick. Thread-safe, wait-free apart from
 * the RCU read lock. Views nest. Errors: KEEL_EINVAL (NULL). */
int keel_view_begin(keel_runtime *rt, const keel_view **out);
/* Close it. Every pointer obtained through the view is invalid afterwards. */
void keel_view_end(const keel_view *v);

/* The tick the view shows (0: the state before the first tick). */
uint64_t keel_view_tick(const keel_view *v);
/* Live entities in the view. */
uint32_t keel_view_count(const keel_view *v);
/* True when e was live at the view's tick. */
bool keel_view_alive(const keel_view *v, keel_entity e);
/* Copy e's value of the VERSIONED component c at the view's tick.
 * Errors: KEEL_EINVAL (NULL, unknown or not VERSIONED c), KEEL_ESTALE (e not
 * live at that tick), KEEL_ENOENT (e lacked c). */
int keel_view_get(const keel_view *v, keel_entity e, keel_component c, void *out);

/* Iterate query q over the view, chunk by chunk, as keel_query_iter /
 * keel_iter_next do over the live world (same order: tables in creation
 * order, chunks in row order, empty chunks skipped):
 *
 *     keel_iter it;
 *     keel_view_iter(v, q, &it);
 *     while (keel_view_next(v, &it))
 *         ... it.count rows: it.entities, KEEL_COLUMN(&it, T, i) ...
 *
 * it.count, it.entities and it.columns[i] (== it.prev[i]) are the view's:
 * its tick's rows and values, consistent across components, valid until
 * keel_view_end. Read them only: they are shared with the live world. Tables
 * the world created after the view was published are not visited, so the
 * rows add up to at most keel_view_count(v). Every `with` component with
 * data must be VERSIONED (the view holds no other values); tags and
 * `without` terms may be of any discipline. Otherwise -- or with a NULL
 * view or query, or a query made on another world -- keel_view_next yields
 * nothing and keel_last_error names the component and its discipline (set
 * by keel_view_iter). Thread-safe beside running ticks (only the query's
 * terms are read, never its live table list); q must outlive the
 * iteration; several iterations may run over one view and one query at
 * once. Cannot fail otherwise; allocates nothing. */
void keel_view_iter(const keel_view *v, const keel_query *q, keel_iter *it);
/* Advance to the next non-empty chunk of the view; false at the end. */
bool keel_view_next(const keel_view *v, keel_iter *it);

#ifdef __cplusplus
}
#endif
#endif
