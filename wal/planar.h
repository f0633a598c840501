/*
 * wal/planar.h -- the planar form of a TICK_CHUNK payload (planar.c), used
 * by the record codec (record.c) only.
 */
#ifndef KEEL_WAL_PLANAR_H
#define KEEL_WAL_PLANAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PLANAR_GROUP_HDR 12u /* u32 component, u32 size, u32 n */

/* Write the planar form of payload (len bytes in the TICK_CHUNK group
 * layout) to out, which has len bytes and does not overlap it. false when
 * payload is not a well-formed group layout (out is then garbage). */
bool planar_encode(const void *payload, size_t len, void *out);

/* The inverse of planar_encode: NULL, or why planar does not parse as the
 * planar form of a group layout of len bytes ("ends inside the header of
 * group", "ends inside the rows of group" -- *group says which --, "is
 * shorter than its 4-byte group count", "has bytes after its last group"
 * -- *group is then UINT32_MAX). */
const char *planar_decode(const void *planar, size_t len, void *out, uint32_t *group);

#endif
