/*
 * wal/planar.h -- the planar forms of TICK_CHUNK and SNAP_CHUNK payloads
 * (planar.c), used by the record codec (record.c) only.
 */
#ifndef KEEL_WAL_PLANAR_H
#define KEEL_WAL_PLANAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PLANAR_GROUP_HDR 12u /* TICK_CHUNK group: u32 component, u32 size, u32 n */
#define PLANAR_SNAP_HDR 16u  /* SNAP_CHUNK: u32 table, u32 chunk, u32 count, u32 ncols */

/* The kinds that have a planar form: TICK_CHUNK and SNAP_CHUNK. */
bool planar_kind(uint32_t kind);

/* Write the planar form of payload (len bytes, a payload of `kind`) to
 * out, which has len bytes and does not overlap it. false when payload
 * does not parse as that kind's layout (out is then garbage). */
bool planar_encode(uint32_t kind, const void *payload, size_t len, void *out);

/* The inverse of planar_encode: NULL, or why planar does not parse as the
 * planar form of a payload of `kind` of len bytes: a sentence fragment
 * ("is shorter than its 4-byte group count", "has bytes after its last
 * group", ...); when it ends with "of group" or "column", *part says which
 * (else it is UINT32_MAX). */
const char *planar_decode(uint32_t kind, const void *planar, size_t len, void *out, uint32_t *part);

#endif
