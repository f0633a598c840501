/*
 * core/hash.h -- the streaming state hasher, FNV-1a and the canonical feed
 * of the world state hash. Part of keel_base (wal/CMakeLists.txt), so the
 * runtime (keel_world_hash) and the offline tools (keel-wal replay, which
 * links libkeel_wal only) share one implementation and cannot drift apart.
 * Self-contained: no other keel header is needed.
 */
#ifndef KEEL_CORE_HASH_H
#define KEEL_CORE_HASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* core_hasher: a streaming 64-bit hash over 8-byte words (a multiply-xorshift
 * construction of our own). Order-sensitive; the result of feeding the same
 * byte sequence is the same on every run and platform of the same
 * endianness. Used by the state hash; pinned by a known-answer test, so a
 * change here is a format change. */
typedef struct core_hasher {
    uint64_t h;
    uint64_t len;
} core_hasher;

void core_hasher_init(core_hasher *s, uint64_t seed);
void core_hasher_u64(core_hasher *s, uint64_t v);
void core_hasher_bytes(core_hasher *s, const void *p, size_t n);
uint64_t core_hasher_final(const core_hasher *s);

/* The world state hash (docs/world.md "State hash"), fed in this order:
 *   core_state_hash_begin(h, nslots);
 *   for every slot in index order:
 *       core_state_hash_slot(h, gen, live);
 *       if live: core_state_hash_component(h, id, value, size) for each
 *                non-TRANSIENT component in id order, then
 *                core_state_hash_entity_end(h);
 *   core_hasher_final(h).
 * keel_world_hash and keel-wal replay both feed it through these calls. */
void core_state_hash_begin(core_hasher *h, uint32_t nslots);
void core_state_hash_slot(core_hasher *h, uint32_t gen, bool live);
void core_state_hash_component(core_hasher *h, uint32_t component, const void *value, uint32_t size);
void core_state_hash_entity_end(core_hasher *h);
/* The hash of no world at all (keel_world_hash(NULL)). */
uint64_t core_state_hash_none(void);

/* A 64-bit digest of a byte string, for telling whether a buffer changed
 * (a checkpoint's chunk payload against the one it stored): four
 * independent multiply-rotate lanes over 32-byte blocks, so the CPU
 * overlaps their multiplies, folded and mixed with the length at the end.
 * Several times faster than core_hasher on large buffers. In memory only:
 * no file or stream holds one. */
uint64_t core_digest64(const void *p, size_t n);

/* 64-bit FNV-1a, for the schedule hash and name hashing. */
uint64_t core_fnv1a64(uint64_t h, const void *p, size_t n);
#define CORE_FNV1A64_INIT 0xcbf29ce484222325ull

/* Finalising mixer for 64-bit keys (hash tables). */
static inline uint64_t core_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

#endif
