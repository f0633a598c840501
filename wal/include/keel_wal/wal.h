/*
 * keel_wal/wal.h -- libkeel_wal, the on-disk format library.
 *
 * The runtime writes data directories through it and the tools read them
 * through it; it never depends on the runtime. docs/wal-format.md describes
 * every byte. Three layers:
 *
 *   records  (record.c: format and zstd codec; crc32c.c) -- the self-describing KWR1
 *            record: a 48-byte header, a payload (raw or zstd), a CRC32C;
 *   payloads (payload.c, encode.c, decode.c, snap.c) -- little-endian
 *            builders, a bounds-checked cursor, the schema payload and the
 *            scalar-type table, the encoder and the decoder of every logical
 *            and snap payload (value rows, lifecycle commands, markers, side
 *            writes, checkpoint chunks);
 *   store    (store.c) -- the LMDB environment of a data directory: the
 *            named databases meta, schema, wal, snap, dict; map growth on
 *            MDB_MAP_FULL; read transactions, WAL cursors and filtered scans
 *            (reader.c).
 *
 * Errors are KEEL_E* codes (keel/error.h) with a keel_last_error() sentence
 * naming the file, LSN or field at fault. Nothing here aborts on bad input.
 * Thread-safety: a kw_store may be shared by threads (LMDB rules: one write
 * at a time, read transactions per thread); codec contexts and payload
 * buffers belong to one thread.
 */
#ifndef KEEL_WAL_WAL_H
#define KEEL_WAL_WAL_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "keel/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Magic that starts every WAL record. */
#define KEEL_WAL_MAGIC "KWR1"
/* Version of the on-disk format this library reads and writes. */
#define KEEL_WAL_FORMAT_VERSION 1u

/* The format version compiled into the library (KEEL_WAL_FORMAT_VERSION). */
uint32_t keel_wal_format_version(void);

/* ---- records ------------------------------------------------------------- */

#define KW_HEADER_SIZE 48u
#define KW_RAW_MAX 0x7fffffffu /* a payload's most bytes, raw and stored (2 GiB - 1) */

typedef enum kw_kind {
    KW_KIND_TICK_CHUNK = 1,   /* value rows changed by the tick's system transactions */
    KW_KIND_TICK_COMMIT = 2,  /* closes a tick's batch (or, flag HOOK, on_first_tick's) */
    KW_KIND_SIDE = 3,         /* a side transaction's after-images */
    KW_KIND_LIFECYCLE = 4,    /* structural commands applied at a sync point */
    KW_KIND_SCHEMA = 5,       /* the component schema */
    KW_KIND_CHECKPOINT = 6,   /* a checkpoint was recorded: it covers LSNs up to a point */
    KW_KIND_EPOCH = 7,        /* a primary's first record on a replicated stream: its epoch. A unit
                                 left open before it was never committed and is dropped */
    KW_KIND_SIDES = 8,        /* several side transactions queued together, in commit order: each
                                 a SIDE payload (kw_side_iter) */
    KW_KIND_SNAP_TABLES = 16, /* snap db: archetype tables and the entity index size */
    KW_KIND_SNAP_SLOTS = 17,  /* snap db: one page of entity slots */
    KW_KIND_SNAP_CHUNK = 18,  /* snap db: one chunk of one table */
    KW_KIND_SNAP_KEYS = 19,   /* snap db: the idempotency keys remembered at the checkpoint */
} kw_kind;

typedef enum kw_codec {
    KW_CODEC_RAW = 0,
    KW_CODEC_ZSTD = 1,
    KW_CODEC_ZSTD_PLANAR = 2, /* TICK_CHUNK and SNAP_CHUNK only: zstd over the payload's planar form
                                 (docs/wal-format.md) */
} kw_codec;

/* "raw", "zstd", "zstd-planar"; "?" when unknown. */
const char *kw_codec_name(uint32_t codec);

/* Record flags. */
#define KW_FLAG_HOOK 1u       /* TICK_COMMIT: the unit is on_first_tick's, the tick is not complete */
#define KW_FLAG_KEY 2u        /* SIDE: the payload ends with the transaction's u64 idempotency key
                                 (in a SIDES record: an entry's flags) */

/* A record's decoded header. */
typedef struct kw_header {
    uint16_t version;
    uint8_t kind;
    uint8_t codec;
    uint64_t lsn;
    uint64_t tick;
    uint32_t flags;
    uint32_t dict_id;
    uint32_t raw_len;
    uint32_t stored_len;
    uint32_t crc;
} kw_header;

/* Short lower-case name of a kind ("tick_chunk", ...), "?" when unknown;
 * kw_kind_parse is the inverse (0 when unknown). */
const char *kw_kind_name(uint32_t kind);
uint32_t kw_kind_parse(const char *name);
/* Does a record of this kind hold changes (TICK_CHUNK, LIFECYCLE, SIDE,
 * SIDES: what kw_each_part and the decoder walk)? */
static inline bool kw_kind_has_changes(uint32_t kind)
{
    return kind == KW_KIND_TICK_CHUNK || kind == KW_KIND_LIFECYCLE || kind == KW_KIND_SIDE || kind == KW_KIND_SIDES;
}

/* CRC32C (Castagnoli), hardware-accelerated where the CPU has SSE4.2.
 * kw_crc32c(0, p, n) is the CRC of p; pass a previous result to extend. */
uint32_t kw_crc32c(uint32_t crc, const void *p, size_t n);

/* Check a stored record: length, magic, version, kind, codec, lengths, CRC.
 * KEEL_ECORRUPT (the sentence says why, with the LSN when the header is
 * readable) or 0 with *out filled. */
int kw_record_check(const void *rec, size_t len, kw_header *out);

/* Why a stored record is invalid: callers steer by it, never by the
 * sentence. */
typedef enum kw_fault {
    KW_FAULT_NONE = 0,
    KW_FAULT_FRAME,           /* shorter than a header or no magic: no header field can be trusted */
    KW_FAULT_HEADER,          /* a readable header with a wrong version, kind, codec, reserved field or length */
    KW_FAULT_CRC,             /* fails its CRC32C check */
    KW_FAULT_KEY,             /* its header names another LSN than the key it is stored under */
    KW_FAULT_GAP,             /* its LSN does not follow the previous one: a record is missing before it */
} kw_fault;

/* kw_record_check that also says why (*fault, when fault is not NULL).
 * On any fault but FRAME, *out holds the header as read: out->lsn is the
 * LSN the sentence names. */
int kw_record_verify(const void *rec, size_t len, kw_header *out, kw_fault *fault);

/* Check the record stored under key `lsn` in a read of consecutive LSNs
 * that expects `expect` next (recovery, keel-wal replay): 0 with *out
 * filled, or KEEL_ECORRUPT with *fault (GAP, KEY or kw_record_verify's) and
 * a sentence naming the key ("WAL record at LSN <key>: ...") unless the
 * record's readable header names its own LSN. */
int kw_wal_check(uint64_t lsn, uint64_t expect, const void *rec, size_t len, kw_header *out, kw_fault *fault);

/* ---- codec --------------------------------------------------------------- */

/* A per-thread codec context: zstd compression and decompression contexts,
 * reused across records (a reused context halves the cost of small
 * compressions), and scratch space. */
typedef struct kw_codec_ctx kw_codec_ctx;

/* The zstd level of a zeroed level field, here and in keel_durable_desc: a
 * fast level (measured 10-17 % less CPU than level 1 for 3 % more bytes,
 * docs/performance.md). */
#define KW_CODEC_LEVEL_DEFAULT (-1)

typedef struct kw_codec_desc {
    int level;                /* zstd level; 0 = KW_CODEC_LEVEL_DEFAULT */
    uint32_t min_compress;    /* payloads shorter than this are stored raw; 0 = 128 bytes */
    int hash_log;             /* zstd's hashLog (ZSTD_c_hashLog); 0 = the level's own */
    bool plain;               /* compress TICK_CHUNK and SNAP_CHUNK payloads as they are (codec
                                 1), not in their planar form (codec 2): for comparisons */
} kw_codec_desc;

int kw_codec_create(const kw_codec_desc *desc, kw_codec_ctx **out);
void kw_codec_destroy(kw_codec_ctx *c);

/* A growable byte buffer. */
typedef struct kw_buf {
    unsigned char *p;
    size_t len, cap;
} kw_buf;

int kw_buf_reserve(kw_buf *b, size_t extra);
void kw_buf_free(kw_buf *b);

/* Append one whole record to out: header, payload (zstd-compressed when
 * that pays and the payload is long enough) and CRC.
 * Errors: KEEL_ENOMEM, KEEL_ERANGE (payload over 2 GiB). */
int kw_record_build(kw_codec_ctx *c, kw_buf *out, uint32_t kind, uint64_t lsn, uint64_t tick, uint32_t flags,
                    const void *payload, size_t len);

/* Build a record whose LSN is filled in later: the header's LSN is 0 and
 * the CRC is left for kw_record_seal. Lets parallel encoders compress while
 * LSNs are handed out in order afterwards. */
int kw_record_build_unsealed(kw_codec_ctx *c, kw_buf *out, uint32_t kind, uint64_t tick, uint32_t flags,
                             const void *payload, size_t len);
/* Set the LSN of the record at rec and compute its CRC. */
void kw_record_seal(void *rec, uint64_t lsn);
/* The whole length (header + stored payload) of the record at rec, read
 * from its header unchecked: walks a buffer of records this process built. */
size_t kw_record_peek_len(const void *rec);
/* The kind in the header of the len bytes at rec, unchecked (0 when too
 * short to hold one): picks records out of a WAL without decoding them. */
uint32_t kw_record_peek_kind(const void *rec, size_t len);

/* The payload of a checked record, decompressed when needed. *payload points
 * into the record (raw codec) or into the context's scratch (valid until the
 * next call on c). Errors: KEEL_ECORRUPT (does not decompress to raw_len;
 * codec 2: its planar form does not parse), KEEL_ENOMEM. */
int kw_record_payload(kw_codec_ctx *c, const void *rec, const kw_header *h, const void **payload);

/* ---- payloads ------------------------------------------------------------ */

/* Builders append little-endian values to a kw_buf (errors: KEEL_ENOMEM). */
int kw_put_u8(kw_buf *b, uint8_t v);
int kw_put_u32(kw_buf *b, uint32_t v);
int kw_put_u64(kw_buf *b, uint64_t v);
int kw_put_bytes(kw_buf *b, const void *p, size_t n);

/* A bounds-checked reader over a payload. A read past the end sets `bad`
 * and returns zeros; check `bad` once after a group of reads. */
typedef struct kw_cursor {
    const unsigned char *p, *end;
    bool bad;
} kw_cursor;

static inline kw_cursor kw_cursor_make(const void *p, size_t n)
{
    return (kw_cursor){(const unsigned char *)p, (const unsigned char *)p + n, false};
}
uint8_t kw_get_u8(kw_cursor *c);
uint32_t kw_get_u32(kw_cursor *c);
uint64_t kw_get_u64(kw_cursor *c);
/* Pointer to the next n bytes (NULL and bad when fewer remain). */
const void *kw_get_bytes(kw_cursor *c, size_t n);
static inline bool kw_cursor_done(const kw_cursor *c)
{
    return c->p == c->end;
}

/* The schema payload (kind SCHEMA), decoded. Strings point into owned copies. */
#define KW_NAME_MAX 63

typedef struct kw_field {
    char name[KW_NAME_MAX + 1];
    uint32_t type;            /* keel_type */
    uint32_t offset;
    uint32_t count;
} kw_field;

typedef struct kw_component {
    uint32_t id;
    char name[KW_NAME_MAX + 1];
    uint32_t size, align, discipline;
    uint32_t nfields;
    kw_field *fields;
} kw_component;

typedef struct kw_schema {
    uint32_t ncomps;
    kw_component *comps;      /* in id order: comps[i].id == i + 1 */
} kw_schema;

/* The scalar types of schema fields (keel_type, 1..13): a value's width
 * in bytes (KEEL_BYTES: 1 per counted byte) and its name ("u8", ...,
 * "entity", "bytes"); 0 and "?" for a type outside the table. The one
 * table: the runtime validates fields and the tools print values by it. */
uint32_t kw_scalar_width(uint32_t type);
const char *kw_scalar_name(uint32_t type);
/* A durability discipline's name (keel_discipline: "versioned",
 * "single_version", "transient"; "?" outside the table): the schema's
 * JSON, the tools and the runtime's messages spell them this way. */
const char *kw_discipline_name(uint32_t discipline);

int kw_schema_encode(const kw_schema *s, kw_buf *out);
/* Errors: KEEL_ECORRUPT (malformed), KEEL_ENOMEM. */
int kw_schema_decode(const void *payload, size_t len, kw_schema *out);
void kw_schema_free(kw_schema *s);
/* Component by id, NULL when absent. */
const kw_component *kw_schema_get(const kw_schema *s, uint32_t id);

/* ---- decoding the logical payloads ----------------------------------------
 * A decoder walks the payload of a TICK_CHUNK, SIDE or LIFECYCLE record and
 * yields one change at a time. Values point into the payload. The
 * component sizes are checked against `schema` when it is given (a size
 * that differs from the stored schema is KEEL_ECORRUPT). */

typedef enum kw_op {
    KW_OP_SET = 0,            /* a value row: entity's component = value */
    KW_OP_SPAWN = 1,          /* entity created with n components (comps/sizes/values) */
    KW_OP_DESTROY = 2,
    KW_OP_ADD = 3,            /* component added with value */
    KW_OP_REMOVE = 4,
} kw_op;

typedef struct kw_change {
    uint32_t op;              /* kw_op */
    uint64_t entity;
    uint32_t component;       /* SET, ADD, REMOVE */
    uint32_t size;            /* SET, ADD */
    const void *value;        /* SET, ADD (NULL for tags) */
    uint32_t n;               /* SPAWN: components */
    const uint32_t *comps;    /* SPAWN: n ids, sizes and values (valid until the next call) */
    const uint32_t *sizes;
    const void *const *values;
} kw_change;

typedef struct kw_decoder {
    kw_cursor cur;
    uint32_t kind;
    uint64_t lsn;             /* for error sentences */
    const kw_schema *schema;
    uint64_t side_seq;        /* SIDE: the transaction's sequence and mode */
    uint32_t side_mode;
    uint64_t side_key;        /* SIDE: its idempotency key (flag KEY; 0 = none) */
    uint32_t left;            /* items (groups, ops, writes) left */
    uint32_t group_left;      /* TICK_CHUNK: rows left in the current group */
    uint32_t group_comp, group_size;
    const unsigned char *group_ents, *group_vals;
    uint32_t group_i;
    uint32_t comps[256], sizes[256];
    const void *values[256];
} kw_decoder;

/* Start decoding `payload` (raw_len bytes) of a record of `kind` at `lsn`.
 * Errors: KEEL_EINVAL (a kind without changes), KEEL_ECORRUPT. */
int kw_decode_begin(kw_decoder *d, uint32_t kind, uint64_t lsn, const void *payload, size_t len,
                    const kw_schema *schema);
/* kw_decode_begin for a checked record's header and payload (raw_len
 * bytes), honouring its flags: a SIDE record with flag KEY yields its key
 * in d->side_key. Readers of whole records use this one: kw_decode_begin
 * (flags 0) refuses a keyed SIDE payload as having trailing bytes. */
int kw_decode_record(kw_decoder *d, const kw_header *h, const void *payload, const kw_schema *schema);
/* 1 with *out filled, 0 at the end (the payload was consumed exactly), or
 * KEEL_ECORRUPT naming the LSN. */
int kw_decode_next(kw_decoder *d, kw_change *out);
/* A TICK_CHUNK's rows a group at a time (what kw_decode_next yields row by
 * row, for a reader that handles a group in one pass): the group's
 * component and value size, its n rows' entities (u64, little-endian,
 * unaligned) and their packed values, valid while the payload is. The two
 * calls may be mixed; a group kw_decode_next started yields its remaining
 * rows. 1, 0 at the end, KEEL_ECORRUPT naming the LSN, KEEL_EINVAL for
 * another kind of record. */
typedef struct kw_group {
    uint32_t component, size, n;
    const unsigned char *entities, *values;
} kw_group;
int kw_decode_group(kw_decoder *d, kw_group *out);
/* The TICK_COMMIT payload. */
typedef struct kw_commit_info {
    uint32_t nrecords, nlive, nslots;
} kw_commit_info;
int kw_decode_commit(const void *payload, size_t len, kw_commit_info *out);

/* ---- encoding the logical payloads ------------------------------------------
 * The writers' side of the decoders above (encode.c): callers pass plain
 * values, wal/ lays out the bytes. A builder that takes a kw_buf appends
 * (errors: KEEL_ENOMEM); *_begin empties the buffer first. */

/* A TICK_CHUNK row group's header: u32 component, u32 size, u32 n, followed
 * by n u64 entities and n values. The unit of work captures rows straight
 * into this layout, so these stay inline. */
#define KW_GROUP_HDR 12u

static inline void kw_group_header_put(unsigned char *p, uint32_t component, uint32_t size, uint32_t n)
{
    uint32_t h[3] = {component, size, n}; /* little-endian host (record.c) */
    memcpy(p, h, sizeof h);
}

static inline void kw_group_header_get(const unsigned char *p, uint32_t *component, uint32_t *size, uint32_t *n)
{
    uint32_t h[3];
    memcpy(h, p, sizeof h);
    *component = h[0];
    *size = h[1];
    *n = h[2];
}

/* TICK_CHUNK: begin (reserving len_hint bytes: the whole payload when it
 * is known), one group_put per group (n entities and n values of `size`
 * bytes, copied in bulk), end with the group count. */
int kw_tick_chunk_begin(kw_buf *out, size_t len_hint);
int kw_tick_chunk_group_put(kw_buf *out, uint32_t component, uint32_t size, uint32_t n, const void *entities,
                            const void *values);
void kw_tick_chunk_end(kw_buf *out, uint32_t ngroups);

/* A component value of a lifecycle command; value NULL logs `size` zeros
 * (TRANSIENT components are not durable). */
typedef struct kw_value {
    uint32_t component;
    uint32_t size;
    const void *value;
} kw_value;

/* LIFECYCLE: begin, one put_op per command, end with the command count.
 * put_op: op is a kw_op; SPAWN logs n values, ADD values[0], REMOVE
 * values[0].component, DESTROY nothing more. */
int kw_lifecycle_begin(kw_buf *out);
int kw_lifecycle_put_op(kw_buf *out, uint32_t op, uint64_t entity, uint32_t n, const kw_value *values);
void kw_lifecycle_end(kw_buf *out, uint32_t nops);

/* TICK_COMMIT: the 16-byte payload (kw_decode_commit reads it). */
#define KW_COMMIT_SIZE 16u
void kw_commit_encode(const kw_commit_info *ci, unsigned char out[KW_COMMIT_SIZE]);

/* CHECKPOINT: the 16-byte marker payload, and its decoder (KEEL_ECORRUPT
 * when it is not 16 bytes). */
#define KW_CHECKPOINT_MARKER_SIZE 16u
void kw_checkpoint_marker_encode(uint64_t covered_lsn, uint64_t tick, unsigned char out[KW_CHECKPOINT_MARKER_SIZE]);
int kw_checkpoint_marker_decode(const void *payload, size_t len, uint64_t *covered_lsn, uint64_t *tick);

/* EPOCH: the epoch a primary took (its lease) and the node that took it
 * (at most KW_EPOCH_NODE_MAX bytes). Decoding: KEEL_ECORRUPT when malformed. */
#define KW_EPOCH_NODE_MAX 64u
typedef struct kw_epoch {
    uint64_t epoch;
    char node[KW_EPOCH_NODE_MAX + 1];
} kw_epoch;
int kw_epoch_encode(kw_buf *out, uint64_t epoch, const char *node);
int kw_epoch_decode(const void *payload, size_t len, kw_epoch *out);

/* SIDE: begin with the transaction's sequence, mode and write count, then
 * one put_write per write (an after-image of `size` bytes). kw_side_size:
 * the payload's bytes for nwrites writes of value_bytes in all (and a key),
 * known before it is encoded. */
static inline size_t kw_side_size(uint32_t nwrites, size_t value_bytes, bool key)
{
    return 16 + (size_t)nwrites * 16 + value_bytes + (key ? 8 : 0);
}
int kw_side_begin(kw_buf *out, uint64_t seq, uint32_t mode, uint32_t nwrites);
int kw_side_put_write(kw_buf *out, uint64_t entity, uint32_t component, uint32_t size, const void *value);
/* End a SIDE payload: a non-zero idempotency key is appended and *flags
 * (the record's flags) gets KW_FLAG_KEY; key 0 adds nothing. */
int kw_side_end(kw_buf *out, uint64_t key, uint32_t *flags);

/* SIDES: u32 count, then per transaction u32 flags (its SIDE record's: KEY
 * or 0), u32 length and that many bytes of SIDE payload. Begin, put each
 * transaction's SIDE payload (kw_side_begin .. kw_side_end) with the flags
 * kw_side_end set, end with the count. */
int kw_sides_begin(kw_buf *out);
int kw_sides_put(kw_buf *out, uint32_t flags, const void *side, size_t len);
void kw_sides_end(kw_buf *out, uint32_t count);

/* The side transactions of a checked SIDE or SIDES record, one at a time,
 * each as the header and payload a SIDE record of that transaction alone
 * would have (kind SIDE, its flags and raw_len; the record's LSN and tick):
 * what kw_decode_record and the other SIDE readers take. A SIDE record
 * yields itself. */
typedef struct kw_side_iter {
    kw_header h;              /* the record's */
    kw_cursor cur;
    uint32_t left;
    bool single;
} kw_side_iter;
/* Errors: KEEL_EINVAL (neither SIDE nor SIDES), KEEL_ECORRUPT (no count). */
int kw_side_iter_begin(kw_side_iter *it, const kw_header *h, const void *payload);
/* 1 with *txn and *payload set, 0 after the last, KEEL_ECORRUPT naming the
 * LSN (a count of 0, an entry past the payload, flags other than KEY,
 * trailing bytes). */
int kw_side_iter_next(kw_side_iter *it, kw_header *txn, const void **payload);
/* fn for each part of a checked record that decodes on its own: a SIDES
 * record's transactions (as kw_side_iter yields them), any other record
 * itself. Stops at fn's first non-zero return and returns it; else
 * KEEL_OK, or KEEL_ECORRUPT for a malformed SIDES record. */
typedef int (*kw_part_fn)(void *arg, const kw_header *h, const void *payload);
int kw_each_part(const kw_header *h, const void *payload, kw_part_fn fn, void *arg);

/* ---- store --------------------------------------------------------------- */

typedef struct kw_store kw_store;

typedef enum kw_db {
    KW_DB_META = 0,
    KW_DB_SCHEMA,
    KW_DB_WAL,
    KW_DB_SNAP,
    KW_DB_DICT,
    KW_DB_COUNT_
} kw_db;

#define KW_OPEN_READONLY 1u   /* never write (tools; works beside a live server) */
#define KW_OPEN_CREATE 2u     /* create the directory and the databases when missing */
#define KW_OPEN_OWN 4u        /* own the directory: hold the exclusive lock of DIR/keel.lock (with the
                                 holder's pid in it) for the store's life; another owner is refused
                                 with KEEL_EBUSY naming the holder (the runtime's open; never READONLY) */
#define KW_OPEN_NOLOCK 8u     /* with READONLY: no LMDB lock file made or used (MDB_NOLOCK), for a directory no
                                 process writes (a finished backup): the open leaves nothing behind */
#define KW_OPEN_TREES_LATER 16u /* leave the walk of the trees to the caller's kw_store_check_trees (keel-wal,
                                   whose exit status tells damage from a directory it cannot open) */

typedef struct kw_store_desc {
    uint32_t flags;           /* KW_OPEN_* */
    uint64_t map_size;        /* initial LMDB map size; 0 = 64 MiB (grows on demand) */
    uint64_t map_max;         /* growth stops here (then KEEL_ENOSPC); 0 = 1 TiB */
} kw_store_desc;

/* Open the LMDB environment of data directory dir (clearing stale reader
 * slots). An existing data.mdb passes kw_store_check_file before LMDB maps
 * or writes it, and kw_store_check_trees before LMDB reads a tree page (an
 * owner's open walks them before LMDB maps the file). Errors: KEEL_ENOENT
 * (no data directory / not a keel directory and no CREATE), KEEL_ECORRUPT
 * (the damage those checks find, a newer format version, or not LMDB),
 * KEEL_EBUSY (KW_OPEN_OWN: another process or store owns the directory;
 * the sentence names its pid), KEEL_EIO, KEEL_ENOMEM. */
int kw_store_open(const char *dir, const kw_store_desc *desc, kw_store **out);
/* Walk every tree of the snapshot a read transaction sees (the free-page
 * tree, the main tree, each named database) with pread, checking what
 * LMDB trusts without checking: each page in the file, naming itself, of
 * the type its depth wants, its nodes, keys and values inside it, its
 * overflow runs whole, the counts of pages and entries those of the tree's
 * record. A live writer leaves that snapshot alone. KEEL_ECORRUPT with a
 * sentence naming the file, the tree and the page; KEEL_EIO, KEEL_ENOMEM. */
int kw_store_check_trees(kw_store *s);
/* Check dir/data.mdb against its own two meta pages without mapping it:
 * an empty file, a file shorter than its meta pages, a meta page that is
 * not one (page flags, page number, LMDB magic, data version, page size
 * differing from the other's), a root beyond the meta's last page, or a
 * last page beyond the file's end (a truncated file, which LMDB would map
 * and fault on). Both metas must pass: LMDB has no checksum to tell a torn
 * meta from a damaged one, and refuses a bad magic in either itself.
 * 0 when the file passes, is missing, or carries no LMDB magic at all
 * (LMDB itself then says "not an LMDB file"); KEEL_ECORRUPT with a
 * sentence naming the file and the damage; KEEL_EIO. */
int kw_store_check_file(const char *dir);
/* What a backup may make in dest, for a caller that removes it when a
 * signal ends the process (kw_backup_unmake). */
typedef struct kw_backup_made {
    const char *const *files;        /* every file it may create in dest, NULL-terminated */
    volatile sig_atomic_t *made;     /* made[i]: files[i] is this backup's (it created it) */
    const char *dir;                 /* dest when the backup created it, else NULL */
} kw_backup_made;

typedef struct kw_backup_desc {
    const char *dir;                 /* the data directory to copy */
    const char *dest;                /* the new directory (or an existing empty one) */
    /* Optional: called with what the backup makes once dest is its own,
     * before anything but data.mdb.new is written there, and with NULL as
     * the backup returns (after a failure: once it removed what it made);
     * the record is gone after that call. */
    void (*made)(const kw_backup_made *m, void *arg);
    void *arg;
} kw_backup_desc;

/* A consistent, compacted copy of the live data directory dir in dest
 * (LMDB's compacting copy inside one read transaction, so it holds whole
 * committed transactions only): dest/data.mdb, written as data.mdb.new,
 * synced and renamed, plus the directory's other regular files (an
 * application's own files, such as keel-world's world.params), each with
 * its source's permission bits. dest must not exist (it is created; its
 * parent must exist) or be an empty directory. The exclusive creation of
 * dest/data.mdb.new, then dest holding nothing else, makes dest this
 * backup's: a second backup into the same dest is refused. Works beside a
 * running server (a reader; a map the server grew meanwhile is taken up).
 * Nothing but data.mdb and the application's files is left in dest (no
 * LMDB lock file). Errors: KEEL_EINVAL (dest exists and is not an empty
 * directory), KEEL_EBUSY (dest holds data.mdb.new: another backup's),
 * KEEL_ENOENT (dir is no keel data directory, dest's parent is missing),
 * KEEL_ECORRUPT (dir's data file is damaged, also where the copy's walk of
 * its trees finds it so), KEEL_EIO, KEEL_ENOSPC, KEEL_ENOMEM. On an error
 * dest is as it was: what the backup made there is removed, dest too when
 * it made it. */
int kw_store_backup(const kw_backup_desc *desc);
/* Remove the files m says a backup made, then dest when it made it and it
 * is empty. Async-signal-safe (unlink, rmdir). */
void kw_backup_unmake(const kw_backup_made *m);
void kw_store_close(kw_store *s);
/* A first open that failed after this store made the directory's data.mdb
 * (KW_OPEN_OWN: under its lock): its close removes what the open made --
 * data.mdb, LMDB's lock file and keel.lock while it still holds the lock,
 * then the directory when this open made it and nothing else is there -- so
 * that a refused start leaves nothing behind. Does nothing for a store that
 * found data.mdb (another's world, or its own of an earlier start). */
void kw_store_forget(kw_store *s);
const char *kw_store_dir(const kw_store *s);
/* Size in bytes of data.mdb. */
uint64_t kw_store_file_size(const kw_store *s);
uint64_t kw_store_map_size(const kw_store *s);

/* ---- writing: one write transaction, retried after growing the map ----- */

typedef struct kw_wtxn kw_wtxn;

/* Run fill(txn, arg) in a write transaction and commit it (synced to disk:
 * a commit that returns 0 is durable). When the map is full, the
 * transaction is aborted, the map grown (doubled, up to map_max) and fill
 * called again from the start -- fill must be repeatable.
 * Errors: fill's error (aborted), KEEL_ENOSPC (map_max reached or disk
 * full), KEEL_EIO. Only one write runs at a time. */
int kw_store_write(kw_store *s, int (*fill)(kw_wtxn *txn, void *arg), void *arg);

/* Inside fill. kw_put_wal appends (MDB_APPEND: lsn must exceed every key). */
int kw_put(kw_wtxn *t, kw_db db, const void *key, size_t klen, const void *val, size_t vlen);
int kw_put_wal(kw_wtxn *t, uint64_t lsn, const void *rec, size_t len);
int kw_del(kw_wtxn *t, kw_db db, const void *key, size_t klen); /* absent keys are fine */
/* Delete every WAL record with LSN <= upto; *deleted counts them. The last
 * one deleted is remembered in meta "trimmed" (KW_META_TRIMMED), the last
 * EPOCH record deleted in meta "trimmed_epoch" (KW_META_TRIMMED_EPOCH). */
int kw_del_wal_upto(kw_wtxn *t, uint64_t upto, uint64_t *deleted);
/* Delete every WAL record with LSN >= from (truncating a bad tail); from
 * <= 1 also drops the two marks of what the WAL's front lost. */
int kw_del_wal_from(kw_wtxn *t, uint64_t from, uint64_t *deleted);
/* Delete every key of db starting with prefix whose key is not in keep
 * (keep(key, klen, arg) true = keep). */
int kw_del_prefix(kw_wtxn *t, kw_db db, const void *prefix, size_t plen,
                  bool (*keep)(const void *key, size_t klen, void *arg), void *arg);

/* Test seam: the nth write from now fails with rc before committing
 * (nth 0 disables). Lets tests drive the runtime's fatal I/O path. */
void kw_store_test_fail_write(kw_store *s, uint32_t nth, int rc);

/* ---- reading ------------------------------------------------------------- */

/* True once any call of this library (or of keel's core under it) in this
 * process failed for lack of memory, whatever its caller did next; never
 * cleared. A reader that prints what it found (keel-wal) asks at the end,
 * so that an answer cut short by memory is never passed off as complete. */
bool kw_out_of_memory_seen(void);

typedef struct kw_rtxn kw_rtxn;

/* A read transaction: a consistent snapshot of the store. Keep it short in
 * a server (LMDB keeps pages alive for it). When another process grew the
 * map since the last transaction, kw_read_begin remaps it, which LMDB
 * allows only while no other transaction of this process is open on the
 * store: hold one read transaction per store at a time (the tools do).
 * Errors: KEEL_EIO, KEEL_ENOMEM. */
int kw_read_begin(kw_store *s, kw_rtxn **out);
void kw_read_end(kw_rtxn *r);
/* Value of key in db: 0 and (*val, *vlen) pointing into the map (valid until
 * kw_read_end), or KEEL_ENOENT. */
int kw_get(kw_rtxn *r, kw_db db, const void *key, size_t klen, const void **val, size_t *vlen);
/* Does db hold key now (a read transaction of its own)? 1 or 0, or an error. */
int kw_store_has(kw_store *s, kw_db db, const void *key, size_t klen);
/* The last record kw_del_wal_upto deleted, as meta "trimmed" remembers it:
 * its LSN and its first KW_HEADER_SIZE bytes (valid for the read
 * transaction). KEEL_ENOENT: none was deleted; KEEL_ECORRUPT: the value is
 * malformed. */
int kw_trimmed_get(kw_rtxn *r, uint64_t *lsn, const void **header);
/* Meta "trimmed_epoch": the last EPOCH record kw_del_wal_upto deleted,
 * whole (unchecked: kw_wal_check it). KEEL_ENOENT: none deleted (or by a
 * keel that kept no such mark). */
int kw_trimmed_epoch_get(kw_rtxn *r, const void **rec, size_t *len);

/* Iterate the WAL from the first LSN >= from: kw_wal_next returns 1 with
 * (lsn, rec, len) and advances, 0 at the end, or a KEEL_E* error. On an
 * error *out is NULL (kw_wal_iter_end ignores it). */
typedef struct kw_walit kw_walit;
int kw_wal_iter(kw_rtxn *r, uint64_t from, kw_walit **out);
int kw_wal_next(kw_walit *it, uint64_t *lsn, const void **rec, size_t *len);
void kw_wal_iter_end(kw_walit *it);
/* Iterate the keys of db starting with prefix, in key order (same protocol). */
int kw_db_iter(kw_rtxn *r, kw_db db, const void *prefix, size_t plen, kw_walit **out);
int kw_db_next(kw_walit *it, const void **key, size_t *klen, const void **val, size_t *vlen);
/* Iterate the snap db in the order a checkpoint loads (kw_db_next): "T",
 * the "S" pages, the "C" chunks, "K"; keys of no such kind are skipped. */
int kw_snap_iter(kw_rtxn *r, kw_walit **out);
/* First and last LSN in the WAL (KEEL_ENOENT when it is empty) and count.
 * KEEL_ECORRUPT when the first or last key is not an 8-byte LSN (a damaged
 * directory; *count is still set). */
int kw_wal_bounds(kw_rtxn *r, uint64_t *first, uint64_t *last, uint64_t *count);

/* A filtered scan of the WAL: records in LSN order within [from_lsn,
 * to_lsn] and [from_tick, to_tick] (0 = unbounded above) whose kind is in
 * `kinds` (a mask of 1u << kind; 0 = every kind). Ticks are not monotonic
 * in LSN order (a CHECKPOINT marker names the tick it covers and follows
 * later ticks), so the tick bounds filter, they do not stop the scan.
 * kw_scan_next checks each record it returns: 1 with *out filled, 0 at the
 * end, or KEEL_ECORRUPT for an invalid record (out->lsn and the sentence
 * name its key's LSN; the next call continues after it) or for a key that
 * is not an 8-byte LSN. */
typedef struct kw_range {
    uint64_t from_lsn, to_lsn;
    uint64_t from_tick, to_tick;
    uint32_t kinds;
} kw_range;

typedef struct kw_record {
    uint64_t lsn;
    const void *rec;          /* the whole record, in the map (valid until kw_read_end) */
    size_t len;
    kw_header h;              /* valid when kw_scan_next returned 1 */
} kw_record;

typedef struct kw_scan kw_scan;
int kw_scan_begin(kw_rtxn *r, const kw_range *range, kw_scan **out);
int kw_scan_next(kw_scan *s, kw_record *out);
void kw_scan_end(kw_scan *s);

/* ---- meta ---------------------------------------------------------------- */

/* meta keys (values little-endian, docs/wal-format.md). */
#define KW_META_FORMAT "format"          /* u32 format version */
#define KW_META_CHECKPOINT "checkpoint"  /* kw_checkpoint_meta */
#define KW_META_TRIMMED "trimmed"        /* u64 LSN, then the first KW_HEADER_SIZE bytes of the last WAL
                                            record deleted from the front (kw_del_wal_upto): another copy
                                            of the log holding that record shares every record before it */
#define KW_META_TRIMMED_EPOCH "trimmed_epoch" /* the last EPOCH record deleted from the front, whole: the
                                            epoch the WAL's first records were written in once their
                                            EPOCH record is gone */
#define KW_META_REPLICATED "replicated"  /* the stream the directory is kept in step with (its name): its
                                            WAL's checkpoint markers are its primaries', not its own */
#define KW_META_STREAM_ID "stream_id" /* u64: the identity of that stream (in its description), so that
                                            a stream made again under the name is told apart; absent: the
                                            stream has none */
#define KW_META_SEEDING "seeding"        /* u64 LSN: a primary is publishing the directory's WAL up to it
                                            to a stream that held none of it (the world's only copy) */
#define KW_SCHEMA_KEY "components"       /* schema db: the SCHEMA record */

typedef struct kw_checkpoint_meta {
    uint64_t tick;            /* the checkpoint holds the state after this tick */
    uint64_t lsn;             /* it covers every WAL record with LSN <= lsn */
    uint64_t created_ns;      /* CLOCK_REALTIME when recorded */
    uint32_t count;           /* checkpoints taken in this directory */
} kw_checkpoint_meta;

void kw_checkpoint_meta_encode(const kw_checkpoint_meta *m, unsigned char out[32]);
int kw_checkpoint_meta_decode(const void *p, size_t n, kw_checkpoint_meta *out);

/* snap db keys: "T" (SNAP_TABLES), "S" + page u32 BE (SNAP_SLOTS),
 * "C" + table u32 BE + chunk u32 BE (SNAP_CHUNK). */
size_t kw_snap_key_slots(unsigned char out[5], uint32_t page);
size_t kw_snap_key_chunk(unsigned char out[9], uint32_t table, uint32_t chunk);

/* ---- checkpoint (snap) payloads ---------------------------------------------
 * Decoders for the three snap record kinds (docs/wal-format.md §4), shared
 * by recovery and keel-wal. Lengths are checked exactly; pointers point
 * into the payload. */

#define KW_SNAP_PAGE_SLOTS 1024u /* slots per SNAP_SLOTS page */
#define KW_SNAP_MAX_COLS 255u    /* columns of a table (component ids 1..255) */

/* Check a snap value as a record of `kind` and return its payload
 * (decompressed into c's scratch when needed: valid until the next call on
 * c). Errors: KEEL_ECORRUPT (bad record, another kind), KEEL_ENOMEM. */
int kw_snap_payload(kw_codec_ctx *c, const void *rec, size_t len, uint32_t kind, const void **payload,
                    size_t *plen);

/* SNAP_TABLES: the header, then kw_snap_tables_next per table (1 with *out
 * filled, 0 after the last one when the payload was consumed exactly, or
 * KEEL_ECORRUPT). */
typedef struct kw_snap_tables {
    uint32_t ntables, nslots, nlive;
    uint32_t next;            /* tables returned so far */
    kw_cursor cur;
} kw_snap_tables;

typedef struct kw_snap_table {
    uint32_t rows, ncols;
    uint32_t comps[KW_SNAP_MAX_COLS]; /* the archetype, in column order */
} kw_snap_table;

int kw_snap_tables_begin(kw_snap_tables *t, const void *payload, size_t len);
int kw_snap_tables_next(kw_snap_tables *t, kw_snap_table *out);

/* SNAP_SLOTS: one page of the entity index. */
typedef struct kw_snap_slots {
    uint32_t first, n;
    const unsigned char *gens; /* n little-endian u32: kw_snap_slot_gen */
    const unsigned char *live; /* n bytes, 1 = live */
} kw_snap_slots;

int kw_snap_slots_decode(const void *payload, size_t len, kw_snap_slots *out);
uint32_t kw_snap_slot_gen(const kw_snap_slots *s, uint32_t i);

/* SNAP_CHUNK: the rows of one chunk of one table. */
typedef struct kw_snap_chunk {
    uint32_t table, chunk, count, ncols;
    uint32_t comps[KW_SNAP_MAX_COLS], sizes[KW_SNAP_MAX_COLS];
    const unsigned char *ents; /* count little-endian u64 handles: kw_snap_chunk_entity */
    const unsigned char *vals[KW_SNAP_MAX_COLS]; /* column i: count x sizes[i] bytes */
} kw_snap_chunk;

int kw_snap_chunk_decode(const void *payload, size_t len, kw_snap_chunk *out);
uint64_t kw_snap_chunk_entity(const kw_snap_chunk *c, uint32_t row);

/* SNAP_KEYS (snap key "K"): the side transactions' idempotency keys the
 * checkpoint remembers, each with the tick it committed in, in commit
 * order. Decoding checks the length exactly and refuses key 0. */
#define KW_SNAP_KEYS_KEY "K"
typedef struct kw_snap_keys {
    uint32_t n;
    const unsigned char *p;   /* n x (u64 key, u64 tick): kw_snap_keys_get */
} kw_snap_keys;

int kw_snap_keys_decode(const void *payload, size_t len, kw_snap_keys *out);
void kw_snap_keys_get(const kw_snap_keys *k, uint32_t i, uint64_t *key, uint64_t *tick);

/* Encoders of the three snap payloads (encode.c). SNAP_TABLES: the header,
 * then one put_table per table, in id order (appending). */
int kw_snap_tables_put_header(kw_buf *out, uint32_t ntables, uint32_t nslots, uint32_t nlive);
int kw_snap_tables_put_table(kw_buf *out, uint32_t rows, uint32_t ncols, const uint32_t *comps);
/* SNAP_SLOTS: slots first .. first+n-1 (live[i] non-zero = live); empties out first. */
int kw_snap_slots_encode(kw_buf *out, uint32_t first, uint32_t n, const uint32_t *gens, const uint8_t *live);
/* SNAP_CHUNK: count rows of ncols stored columns (values[i]: count x
 * sizes[i] bytes), entities: count u64 handles; empties out first. */
int kw_snap_chunk_encode(kw_buf *out, uint32_t table, uint32_t chunk, uint32_t count, uint32_t ncols,
                         const uint32_t *comps, const uint32_t *sizes, const void *entities,
                         const void *const *values);
/* SNAP_KEYS: n keys and their ticks (parallel arrays); empties out first. */
int kw_snap_keys_encode(kw_buf *out, uint32_t n, const uint64_t *keys, const uint64_t *ticks);

#ifdef __cplusplus
}
#endif
#endif
