/*
 * keel/error.h -- status codes, the thread-local last-error sentence, and
 * structured diagnostics.
 *
 * Every fallible keel function returns an int: 0 on success, a negative
 * KEEL_E* code on failure. On failure it also leaves a sentence naming the
 * culprit (component, entity, command, file ...) in keel_last_error() of the
 * calling thread. A failed call changes nothing unless its documentation says
 * which prefix of its work stays applied.
 */
#ifndef KEEL_ERROR_H
#define KEEL_ERROR_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    KEEL_OK        =   0,
    KEEL_EINVAL    =  -1,  /* bad argument, descriptor or schema */
    KEEL_ESTALE    =  -2,  /* null, stale or foreign entity handle */
    KEEL_ECONFLICT =  -3,  /* transaction read set changed underneath */
    KEEL_EIO       =  -4,  /* I/O error from the storage layer */
    KEEL_ENOSPC    =  -5,  /* out of space: disk, map, entity slots */
    KEEL_ECORRUPT  =  -6,  /* on-disk data failed validation */
    KEEL_EBUSY     =  -7,  /* object is in a state that refuses the call */
    KEEL_ETIMEDOUT =  -8,  /* a wait ran out of time */
    KEEL_EFATAL    =  -9,  /* runtime latched into its fatal state */
    KEEL_ENOMEM    = -10,  /* allocation failed */
    KEEL_ENOENT    = -11,  /* named thing does not exist (component on entity, name) */
    KEEL_EEXIST    = -12,  /* named thing already exists */
    KEEL_ERANGE    = -13,  /* value outside its documented range */
    KEEL_EALREADY  = -14,  /* the side transaction's idempotency key already committed: nothing applied */
    KEEL_EFENCED   = -15,  /* another primary took the world over: this one acknowledges nothing more */
    KEEL_EUNAVAILABLE = -16, /* the replication stream cannot be reached or has not acknowledged (yet) */
};

/* Short stable name of a status code: "KEEL_ESTALE", ... Unknown codes give
 * "KEEL_E?". Thread-safe, never NULL, static storage. */
const char *keel_strerror(int rc);

/* Sentence describing the most recent failure on the calling thread, e.g.
 * "keel_set: entity 0x0000000200000007 is stale (slot 7 holds generation 3)".
 * Only meaningful right after a call returned an error; a successful call
 * does not clear it. Thread-local storage, valid until the thread's next keel
 * call; never NULL ("" when no error happened yet). */
const char *keel_last_error(void);

/* ---- structured diagnostics ---------------------------------------------
 * Diagnostics are events "subsystem/event key=value ...". They are rate
 * limited per (subsystem, event) pair: at most KEEL_LOG_BURST events of one
 * pair per second; the rest are counted and the count is reported in the
 * `suppressed` field of the next delivered event of that pair. The success
 * path of the library logs nothing. */

typedef enum keel_log_level {
    KEEL_LOG_DEBUG = 0,
    KEEL_LOG_INFO  = 1,
    KEEL_LOG_WARN  = 2,
    KEEL_LOG_ERROR = 3,
} keel_log_level;

#define KEEL_LOG_BURST 10

typedef struct keel_log_event {
    keel_log_level level;
    const char *subsystem;   /* "world", "cmd", ... */
    const char *event;       /* "ignored_stale", ... */
    const char *fields;      /* "entity=0x... reason=stale" (may be "") */
    uint64_t suppressed;     /* events of this pair dropped since the last delivered one */
} keel_log_event;

typedef void (*keel_log_fn)(const keel_log_event *ev, void *user);

/* Route diagnostics to fn (NULL restores the default, which prints one line
 * per event to stderr). Events below min_level are dropped before rate
 * limiting. Thread-safe; the callback may be called from any thread, one
 * call at a time. Returns nothing: it cannot fail. */
void keel_log_set(keel_log_fn fn, void *user, keel_log_level min_level);

#ifdef __cplusplus
}
#endif
#endif
