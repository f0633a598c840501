/*
 * keel_wal/wal.h -- libkeel_wal, the on-disk format library.
 *
 * The runtime writes data directories through it and the tools read them
 * through it; it never depends on the runtime. docs/wal-format.md will
 * describe the format byte for byte as the records are defined.
 */
#ifndef KEEL_WAL_WAL_H
#define KEEL_WAL_WAL_H

#include <stdint.h>

/* Magic that starts every WAL record. */
#define KEEL_WAL_MAGIC "KWR1"
/* Version of the on-disk format this library reads and writes. */
#define KEEL_WAL_FORMAT_VERSION 1u

/* The format version compiled into the library (KEEL_WAL_FORMAT_VERSION). */
uint32_t keel_wal_format_version(void);

#endif
