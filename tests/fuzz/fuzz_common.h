/*
 * tests/fuzz/fuzz_common.h -- what the two fuzz targets share: the
 * invariant checks (a violation prints why and calls abort(), so libFuzzer
 * and the replay driver report it as a crash), a decoder that walks every
 * payload layout of docs/wal-format.md through libkeel_wal, and an encoder
 * of logical changes written from the format page (not from wal/), used
 * for the round-trip checks.
 *
 * The targets link libkeel_wal only, never the runtime.
 */
#ifndef KEEL_FUZZ_COMMON_H
#define KEEL_FUZZ_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keel_wal/wal.h"

/* libFuzzer's entry points; replay_main.c calls the same two. */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Report a broken invariant (with keel_last_error()) and abort(). */
void fz_fail(const char *file, int line, const char *fmt, ...) __attribute__((noreturn, format(printf, 3, 4)));
#define FZ_CHECK(cond, ...)                                \
    do {                                                   \
        if (!(cond))                                       \
            fz_fail(__FILE__, __LINE__, __VA_ARGS__);      \
    } while (0)

/* A refusal of bad input: rc is KEEL_ECORRUPT with a sentence, and when an
 * LSN is known to the function that refused, the sentence names it
 * ("LSN <lsn>"). `what` names the call for the report. */
void fz_expect_corrupt(int rc, bool lsn_known, uint64_t lsn, const char *what);

/* Little-endian reads of the input (the fuzzer's bytes). */
uint32_t fz_rd32(const void *p);
uint64_t fz_rd64(const void *p);

/* The schema the corpus generator registers (make_corpus.c): records of
 * the seed corpus decode against it, mutated ones exercise the size
 * checks. */
const kw_schema *fz_corpus_schema(void);

/* Decode a checked record's payload by its kind, as a reader would:
 * decompress, then walk the payload (changes, commit marker, schema,
 * checkpoint marker, snap layouts). The payload is copied into a buffer of
 * exactly raw_len bytes first, so a read past it is an ASan report. With
 * `schema`, changes are also decoded against it and every value is read
 * field by field through the stored schema. Returns 0 or the error the
 * library returned (checked to be KEEL_ECORRUPT naming h->lsn). */
int fz_decode_record(kw_codec_ctx *c, const void *rec, const kw_header *h, const kw_schema *schema);

/* Decode `payload` as a change record of `kind` (TICK_CHUNK, SIDE or
 * LIFECYCLE) at `lsn`; on success append the canonical encoding of the
 * changes (fz_encode) to *canon and return 0; else the library's error
 * (checked: KEEL_ECORRUPT naming lsn). The decoded fields are checked
 * (sizes within the payload, spawn lists, schema sizes). */
int fz_decode_changes(uint32_t kind, uint64_t lsn, const void *payload, size_t len, const kw_schema *schema,
                      kw_buf *canon);

/* kw_decode_commit: accepts exactly the 16-byte layouts and reads them
 * right; else KEEL_ECORRUPT. */
int fz_decode_commit(const void *payload, size_t len);

/* Walk a decoded schema: ids in order, names terminated, and the
 * kw_schema_encode of it is byte for byte the payload it came from. */
void fz_check_schema(const kw_schema *s, const void *payload, size_t len);

/* ---- the encoder (from docs/wal-format.md) --------------------------------- */

/* One logical change, as the encoder takes it. */
typedef struct fz_change {
    uint32_t op;              /* kw_op */
    uint64_t entity;
    uint32_t component, size; /* SET, ADD (size), REMOVE (component) */
    const void *value;
    uint32_t n;               /* SPAWN */
    const uint32_t *comps, *sizes;
    const void *const *values;
} fz_change;

/* Append the payload of a record of `kind` holding changes[0..n) to out.
 * TICK_CHUNK: one group per run of rows with the same component and size;
 * SIDE: seq and mode first. */
void fz_encode(kw_buf *out, uint32_t kind, uint64_t seq, uint32_t mode, const fz_change *changes, size_t n);

/* Round trip through the library: build a record of kind/lsn/tick/flags
 * around payload with kw_record_build (and build_unsealed + seal, which
 * must give the same bytes), check it, read the payload back: every header
 * field and every payload byte must come back. */
void fz_round_trip_record(kw_codec_ctx *c, uint32_t kind, uint64_t lsn, uint64_t tick, uint32_t flags,
                          const void *payload, size_t len);

#endif
