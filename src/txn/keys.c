/*
 * txn/keys.c -- the idempotency keys of side transactions: which keys
 * committed during the last `window` ticks (docs/transactions.md,
 * "Idempotency keys").
 *
 * A hash map (open addressing, linear probing, key 0 = empty, deletion by
 * backward shift so no tombstones accumulate) answers "did this key
 * commit, at which tick, in which record"; a ring of the entries in commit
 * order lets expiry pop the oldest keys without scanning the map. Ticks enter the
 * ring in commit order, which is tick order, so the ring's front is the
 * oldest key; the map entry's own tick is what decides whether a key is
 * remembered, so an entry the ring has not reached yet never answers past
 * its window. Everything here runs under the side lock (or, at recovery,
 * before any commit can).
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "txn/txn_internal.h"

static uint32_t key_hash(uint64_t key)
{
    return (uint32_t)core_mix64(key);
}

void keys_init(txn_keys *k, uint64_t window)
{
    *k = (txn_keys){.window = window ? window : TXN_KEYS_DEFAULT_WINDOW};
}

void keys_fini(txn_keys *k)
{
    free(k->map);
    free(k->ring);
    *k = (txn_keys){.window = k->window};
}

/* Remembered at tick `now`: committed less than `window` ticks before. A
 * key whose tick is ahead of now (a record replayed from a tick the crash
 * lost, before that tick runs again) is as young as can be. */
static bool live(const txn_keys *k, uint64_t tick, uint64_t now)
{
    return now <= tick || now - tick < k->window;
}

static txn_key *map_slot(const txn_keys *k, uint64_t key)
{
    uint32_t mask = k->map_cap - 1;
    for (uint32_t i = key_hash(key) & mask;; i = (i + 1) & mask)
        if (!k->map[i].key || k->map[i].key == key)
            return &k->map[i];
}

static void map_del(txn_keys *k, txn_key *s)
{
    uint32_t mask = k->map_cap - 1, i = (uint32_t)(s - k->map);
    k->map[i].key = 0;
    k->map_n--;
    for (uint32_t j = (i + 1) & mask; k->map[j].key; j = (j + 1) & mask) {
        uint32_t h = key_hash(k->map[j].key) & mask;
        /* the entry at j may move back to the hole at i unless its home h
         * lies cyclically in (i, j] */
        bool stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
        if (!stays) {
            k->map[i] = k->map[j];
            k->map[j].key = 0;
            i = j;
        }
    }
}

const txn_key *keys_find(const txn_keys *k, uint64_t key, uint64_t now)
{
    if (!key || !k->map_n)
        return NULL;
    const txn_key *s = map_slot(k, key);
    return s->key && live(k, s->tick, now) ? s : NULL;
}

void keys_expire(txn_keys *k, uint64_t now)
{
    while (k->ring_n) {
        txn_key *e = &k->ring[k->ring_head];
        if (live(k, e->tick, now))
            break;
        txn_key *s = map_slot(k, e->key);
        if (s->key && s->tick == e->tick) /* not re-committed since (then a younger entry follows) */
            map_del(k, s);
        k->ring_head = (k->ring_head + 1) & (k->ring_cap - 1);
        k->ring_n--;
    }
}

int keys_reserve(txn_keys *k, uint32_t extra)
{
    if ((size_t)(k->map_n + extra) * 2 > k->map_cap) {
        uint32_t cap = k->map_cap ? k->map_cap : 64;
        while ((size_t)(k->map_n + extra) * 2 > cap) {
            if (cap > UINT32_MAX / 2)
                return core_fail(KEEL_ENOMEM, "too many idempotency keys");
            cap *= 2;
        }
        txn_keys g = *k;
        g.map = calloc(cap, sizeof *g.map);
        if (!g.map)
            return core_fail(KEEL_ENOMEM, "out of memory growing the idempotency keys");
        g.map_cap = cap;
        for (uint32_t i = 0; i < k->map_cap; i++)
            if (k->map[i].key)
                *map_slot(&g, k->map[i].key) = k->map[i];
        free(k->map);
        k->map = g.map;
        k->map_cap = cap;
    }
    if (k->ring_n + extra > k->ring_cap) {
        uint32_t cap = k->ring_cap ? k->ring_cap : 64;
        while (k->ring_n + extra > cap) {
            if (cap > UINT32_MAX / 2)
                return core_fail(KEEL_ENOMEM, "too many idempotency keys");
            cap *= 2;
        }
        txn_key *ring = malloc((size_t)cap * sizeof *ring);
        if (!ring)
            return core_fail(KEEL_ENOMEM, "out of memory growing the idempotency keys");
        for (uint32_t i = 0; i < k->ring_n; i++) /* unwrapped: the front moves to 0 */
            ring[i] = k->ring[(k->ring_head + i) & (k->ring_cap - 1)];
        free(k->ring);
        k->ring = ring;
        k->ring_cap = cap;
        k->ring_head = 0;
    }
    return KEEL_OK;
}

void keys_add(txn_keys *k, uint64_t key, uint64_t tick, uint64_t lsn)
{
    txn_key *s = map_slot(k, key);
    if (s->key == key && s->tick == tick)
        return; /* already there (recovery: a key both loaded and replayed) */
    if (!s->key)
        k->map_n++;
    *s = (txn_key){key, tick, lsn};
    k->ring[(k->ring_head + k->ring_n++) & (k->ring_cap - 1)] = *s;
}

uint32_t keys_count(const txn_keys *k)
{
    return k->map_n;
}

int keys_snapshot(const txn_keys *k, uint64_t now, txn_key **out, uint32_t *n)
{
    *out = NULL;
    *n = 0;
    if (!k->map_n)
        return KEEL_OK;
    txn_key *v = malloc((size_t)k->map_n * sizeof *v);
    if (!v)
        return core_fail(KEEL_ENOMEM, "out of memory copying the idempotency keys");
    uint32_t m = 0;
    for (uint32_t i = 0; i < k->ring_n && m < k->map_n; i++) {
        const txn_key *e = &k->ring[(k->ring_head + i) & (k->ring_cap - 1)];
        const txn_key *s = map_slot(k, e->key);
        if (s->key && s->tick == e->tick && live(k, e->tick, now))
            v[m++] = *e; /* the map's entry: a key re-committed after expiry is listed at its last commit */
    }
    *out = v;
    *n = m;
    return KEEL_OK;
}
