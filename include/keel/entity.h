/*
 * keel/entity.h -- entity handles.
 *
 * A handle is 64 bits: the low 32 bits are the slot index, the high 32 bits
 * the slot's generation. Generations start at 1, so no live handle is 0 and
 * KEEL_ENTITY_NULL (0) never names an entity. Destroying an entity bumps its
 * slot's generation, so every copy of the old handle becomes stale: any
 * operation on it fails with KEEL_ESTALE (or, as a queued command, is ignored
 * and counted) and never touches the slot's next occupant.
 *
 * Allocation is deterministic: a new entity takes the lowest free slot index
 * (or a new slot past the highest one used), with that slot's current
 * generation. The allocator state is therefore a pure function of the slots'
 * generations and liveness, which is what the state hash covers and what a
 * checkpoint stores.
 */
#ifndef KEEL_ENTITY_H
#define KEEL_ENTITY_H

#include <stdint.h>

typedef uint64_t keel_entity;

#define KEEL_ENTITY_NULL ((keel_entity)0)
#define KEEL_ENTITY_INDEX(e) ((uint32_t)((e) & 0xffffffffu))
#define KEEL_ENTITY_GEN(e)   ((uint32_t)((e) >> 32))
#define KEEL_ENTITY_MAKE(index, gen) (((keel_entity)(gen) << 32) | (keel_entity)(uint32_t)(index))

#endif
