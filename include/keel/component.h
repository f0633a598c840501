/*
 * keel/component.h -- component types and their field schemas.
 *
 * A component type is registered once per world with a descriptor. Its id is
 * small and dense (1, 2, 3 ... in registration order; 0 is "no component"),
 * so the same registrations always give the same ids. The field schema
 * describes the bytes of one value so that offline tools can decode WAL
 * records without the program that wrote them.
 */
#ifndef KEEL_COMPONENT_H
#define KEEL_COMPONENT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint32_t keel_component;       /* 0 = none */

#define KEEL_MAX_COMPONENTS 255        /* ids 1..255 */
/* Component and field names (and the schedule's system, track and dag
 * names): 1 to KEEL_NAME_MAX bytes of valid UTF-8 with no control character
 * (U+0000-U+001F, U+007F). Overlong encodings, surrogates and code points
 * past U+10FFFF are not UTF-8. Names go as they are into the metrics'
 * labels and the trace's JSON, which must be UTF-8; anything else is
 * refused with KEEL_EINVAL, the last error naming the offending byte's
 * offset. */
#define KEEL_NAME_MAX 63               /* longest name, in bytes */
#define KEEL_MAX_FIELDS 64             /* fields per component */

/* How a component's writes are isolated and whether they are durable
 * (docs/transactions.md, "Disciplines"). The state hash skips TRANSIENT
 * components. */
typedef enum keel_discipline {
    KEEL_VERSIONED = 0,       /* default: copy-on-write, rolled back on failure, durable */
    KEEL_SINGLE_VERSION = 1,  /* written in place, durable at the fence */
    KEEL_TRANSIENT = 2,       /* written in place, never durable, empty after open */
} keel_discipline;

/* Scalar type of a schema field. 0 is invalid on purpose: a zeroed field
 * descriptor is rejected instead of silently meaning "u8". */
typedef enum keel_type {
    KEEL_TYPE_INVALID = 0,
    KEEL_U8, KEEL_U16, KEEL_U32, KEEL_U64,
    KEEL_I8, KEEL_I16, KEEL_I32, KEEL_I64,
    KEEL_F32, KEEL_F64,
    KEEL_BOOL,      /* one byte, 0 or 1 */
    KEEL_ENTITY,    /* a keel_entity (8 bytes) */
    KEEL_BYTES,     /* opaque bytes; count = number of bytes */
    KEEL_TYPE_COUNT_
} keel_type;

typedef struct keel_field {
    const char *name;     /* required, unique within the component, a name (KEEL_NAME_MAX) */
    keel_type type;       /* required */
    uint32_t offset;      /* byte offset inside the value */
    uint32_t count;       /* array length; 0 = 1 (a scalar). For KEEL_BYTES: byte length */
} keel_field;

typedef struct keel_component_desc {
    const char *name;          /* required, unique within the world, a name (KEEL_NAME_MAX) */
    uint32_t size;             /* bytes of one value, a multiple of align; 0 = a tag (no data, no fields) */
    uint32_t align;            /* power of two <= 64; 0 = largest field alignment (1 for tags) */
    keel_discipline discipline;/* default KEEL_VERSIONED */
    const keel_field *fields;  /* schema: required (field_count >= 1) when size > 0 -- declare a
                                  KEEL_BYTES field for opaque data; NULL and 0 for tags */
    uint32_t field_count;      /* at most KEEL_MAX_FIELDS */
} keel_component_desc;

/* Size in bytes of one element of a scalar type, 0 for an invalid type. */
uint32_t keel_type_size(keel_type t);
/* Lower-case name ("u32", "f64", "entity", "bytes"), "?" for an invalid type. */
const char *keel_type_name(keel_type t);
/* Lower-case name ("versioned", "single_version", "transient"), "?" for
 * anything else: how messages and the tools name a discipline. */
const char *keel_discipline_name(keel_discipline d);

#ifdef __cplusplus
}
#endif
#endif
