/*
 * core/hash.c -- the streaming state hasher, the state hash's canonical
 * feed, the change digest and FNV-1a. Built into keel_base: the runtime and
 * keel-wal share it.
 *
 * core_hasher folds the input as little-endian 8-byte words; each word is
 * mixed (core_mix64) before it is combined, so every input bit reaches every
 * output bit, and the running state is rotated and multiplied so word order
 * matters. A short tail is zero-padded; the total length goes into the final
 * mix so "ab" and "ab\0" differ.
 */
#include <string.h>

#include "core/hash.h"

#define HASH_MUL 0x9e3779b97f4a7c15ull

void core_hasher_init(core_hasher *s, uint64_t seed)
{
    s->h = core_mix64(seed ^ HASH_MUL);
    s->len = 0;
}

static inline void hasher_word(core_hasher *s, uint64_t w)
{
    uint64_t h = s->h ^ core_mix64(w + HASH_MUL);
    s->h = ((h << 27) | (h >> 37)) * HASH_MUL + 0x632be59bd9b4e019ull;
}

void core_hasher_u64(core_hasher *s, uint64_t v)
{
    hasher_word(s, v);
    s->len += 8;
}

void core_hasher_bytes(core_hasher *s, const void *p, size_t n)
{
    const unsigned char *b = p;
    s->len += n;
    for (; n >= 8; n -= 8, b += 8) {
        uint64_t w;
        memcpy(&w, b, 8);
        hasher_word(s, w);
    }
    if (n) {
        uint64_t w = 0;
        memcpy(&w, b, n);
        hasher_word(s, w);
    }
}

/* ---- core_digest64 ---- */

#define DIGEST_P1 0x9e3779b185ebca87ull
#define DIGEST_P2 0xc2b2ae3d27d4eb4full

static inline uint64_t rotl64(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

static inline uint64_t digest_lane(uint64_t acc, uint64_t w)
{
    return rotl64(acc + w * DIGEST_P2, 31) * DIGEST_P1;
}

uint64_t core_digest64(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t a[4] = {DIGEST_P1 + DIGEST_P2, DIGEST_P2, 0, -DIGEST_P1}, w;
    size_t len = n;
    for (; n >= 32; n -= 32, b += 32)
        for (int l = 0; l < 4; l++) {
            memcpy(&w, b + 8 * l, 8);
            a[l] = digest_lane(a[l], w);
        }
    uint64_t h = rotl64(a[0], 1) + rotl64(a[1], 7) + rotl64(a[2], 12) + rotl64(a[3], 18);
    for (; n >= 8; n -= 8, b += 8) {
        memcpy(&w, b, 8);
        h = digest_lane(h, w);
    }
    if (n) {
        w = 0;
        memcpy(&w, b, n);
        h = digest_lane(h, w ^ ((uint64_t)n << 56));
    }
    return core_mix64(h ^ core_mix64(len));
}

uint64_t core_hasher_final(const core_hasher *s)
{
    return core_mix64(s->h ^ core_mix64(s->len));
}

/* ---- the world state hash's feed (keel_world_hash, keel-wal replay) ---- */

#define STATE_HASH_SEED 0x6b65656c2d737431ull /* "keel-st1" */

void core_state_hash_begin(core_hasher *h, uint32_t nslots)
{
    core_hasher_init(h, STATE_HASH_SEED);
    core_hasher_u64(h, nslots);
}

void core_state_hash_slot(core_hasher *h, uint32_t gen, bool live)
{
    core_hasher_u64(h, (uint64_t)gen << 1 | live);
}

void core_state_hash_component(core_hasher *h, uint32_t component, const void *value, uint32_t size)
{
    core_hasher_u64(h, component);
    if (size)
        core_hasher_bytes(h, value, size);
}

void core_state_hash_entity_end(core_hasher *h)
{
    core_hasher_u64(h, 0); /* (c, bytes) sequences cannot run into the next slot */
}

uint64_t core_state_hash_none(void)
{
    core_hasher h;
    core_hasher_init(&h, STATE_HASH_SEED);
    return core_hasher_final(&h);
}

uint64_t core_fnv1a64(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
