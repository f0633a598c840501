/*
 * core/ranges.c -- task ranges: the tasks of one parallel piece of work cut
 * into contiguous ranges, range w the home of worker w. A worker claims the
 * tasks of its home from the front, in index order; once its home is empty
 * (or when it has none: w >= the ranges) it steals single tasks from the
 * back of the range with the most tasks left.
 *
 * A range is one 64-bit word (lo << 32 | hi), changed only by CAS: the
 * owner's lo + 1 and a thief's hi - 1 both require lo < hi in the word they
 * replace, so every task is claimed exactly once, whoever claims it and in
 * whatever interleaving (two claimers from the same front are safe too).
 * The ranges are set with relaxed stores: the caller publishes them, with
 * whatever the tasks read, through its own release-acquire hand-off to the
 * claimers (a ticket, an epoch) before anyone claims.
 *
 * Why homes by worker: each worker streams its own contiguous stretch of
 * memory (a shared counter deals neighbouring tasks to different threads),
 * and the same stretch from one use to the next, which the caches nearest
 * its CPU may still hold (docs/scheduling.md). Stealing keeps the balance
 * when the stretches take unequal times or a worker comes late.
 */
#include <stdatomic.h>

#include "core/core.h"

void core_range_set(_Atomic uint64_t *range, uint32_t lo, uint32_t hi)
{
    atomic_store_explicit(range, (uint64_t)lo << 32 | hi, memory_order_relaxed);
}

/* One task from the front of *r, or UINT32_MAX when it is empty. */
static uint32_t claim_front(_Atomic uint64_t *r)
{
    uint64_t v = atomic_load(r);
    while ((uint32_t)(v >> 32) < (uint32_t)v)
        if (atomic_compare_exchange_weak(r, &v, v + ((uint64_t)1 << 32)))
            return (uint32_t)(v >> 32);
    return UINT32_MAX;
}

/* One task from the back of the fullest range, or UINT32_MAX when every
 * range is empty. */
static uint32_t steal(_Atomic uint64_t *ranges, uint32_t n)
{
    for (;;) {
        uint32_t best = UINT32_MAX, most = 0;
        uint64_t v = 0;
        for (uint32_t i = 0; i < n; i++) {
            uint64_t w = atomic_load(&ranges[i]);
            uint32_t left = (uint32_t)w - (uint32_t)(w >> 32);
            if ((uint32_t)(w >> 32) < (uint32_t)w && left > most)
                best = i, most = left, v = w;
        }
        if (best == UINT32_MAX)
            return UINT32_MAX;
        if (atomic_compare_exchange_strong(&ranges[best], &v, v - 1))
            return (uint32_t)v - 1;
    }
}

uint32_t core_range_claim(_Atomic uint64_t *ranges, uint32_t n, uint32_t *home, uint32_t worker)
{
    if (*home == UINT32_MAX)
        *home = worker < n ? worker : n; /* n: a thief from the start */
    if (*home < n) {
        uint32_t t = claim_front(&ranges[*home]);
        if (t != UINT32_MAX)
            return t;
        *home = n; /* home drained: steal from now on */
    }
    return steal(ranges, n);
}
