/*
 * core/hist.h -- fixed-bucket histograms for the metrics exposition
 * (docs/operations.md "Monitor").
 *
 * One thread or many observe, any thread reads, nobody locks: every bucket
 * and the sum are relaxed atomics, so an observation costs a short scan of
 * the bounds and two atomic adds, and it never waits for a reader. Buckets
 * count non-cumulatively; a reader's copy makes them cumulative and takes
 * the count from the last one, so the count always equals the +Inf bucket
 * even when an observation lands while the copy is being taken (the sum may
 * then lag or lead it by that one observation).
 *
 * Values are integers in the histogram's base unit (nanoseconds for
 * durations, records for sizes); the bounds are in the same unit and the
 * exposition scales them.
 */
#ifndef KEEL_CORE_HIST_H
#define KEEL_CORE_HIST_H

#include <stdatomic.h>
#include <stdint.h>

#define CORE_HIST_MAX 16           /* finite bounds at most; one more bucket holds the rest (+Inf) */

typedef struct core_hist {
    const uint64_t *bounds;        /* ascending upper bounds (inclusive, as Prometheus' `le`) */
    uint32_t n;                    /* finite bounds, <= CORE_HIST_MAX */
    _Atomic uint64_t bucket[CORE_HIST_MAX + 1]; /* [i]: bounds[i-1] < v <= bounds[i]; [n]: above bounds[n-1] */
    _Atomic uint64_t sum;
} core_hist;

/* A reader's copy: cumulative buckets, count = cum[n]. */
typedef struct core_hist_snap {
    const uint64_t *bounds;
    uint32_t n;
    uint64_t cum[CORE_HIST_MAX + 1];
    uint64_t sum, count;
} core_hist_snap;

/* Give h its bounds (a static array of n ascending values) and zero it. */
static inline void core_hist_init(core_hist *h, const uint64_t *bounds, uint32_t n)
{
    h->bounds = bounds;
    h->n = n < CORE_HIST_MAX ? n : CORE_HIST_MAX;
    for (uint32_t i = 0; i <= CORE_HIST_MAX; i++)
        atomic_init(&h->bucket[i], 0);
    atomic_init(&h->sum, 0);
}

static inline void core_hist_observe(core_hist *h, uint64_t v)
{
    uint32_t i = 0;
    while (i < h->n && v > h->bounds[i])
        i++;
    atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum, v, memory_order_relaxed);
}

static inline void core_hist_read(const core_hist *h, core_hist_snap *out)
{
    core_hist *m = (core_hist *)h; /* atomic loads take non-const pointers in C11 */
    out->bounds = h->bounds;
    out->n = h->n;
    out->sum = atomic_load_explicit(&m->sum, memory_order_relaxed);
    uint64_t c = 0;
    for (uint32_t i = 0; i <= h->n; i++)
        out->cum[i] = c += atomic_load_explicit(&m->bucket[i], memory_order_relaxed);
    out->count = c;
}

#endif
