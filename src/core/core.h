/*
 * core/core.h -- internal helpers shared by every subsystem: setting the
 * thread-local last error, emitting diagnostics, hashing.
 */
#ifndef KEEL_CORE_H
#define KEEL_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "keel/error.h"

#if defined(__GNUC__)
#define CORE_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define CORE_LIKELY(x) __builtin_expect(!!(x), 1)
#define CORE_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define CORE_PRINTF(f, a)
#define CORE_LIKELY(x) (x)
#define CORE_UNLIKELY(x) (x)
#endif

/* Set the calling thread's last error to the formatted sentence and return
 * rc, so failures read `return core_fail(KEEL_EINVAL, "...", ...);`. */
int core_fail(int rc, const char *fmt, ...) CORE_PRINTF(2, 3);

/* Emit a diagnostic "subsystem/event fields" through the rate limiter.
 * fields is a printf format producing "key=value ..." pairs. */
void core_log(keel_log_level level, const char *subsystem, const char *event,
              const char *fields, ...) CORE_PRINTF(4, 5);

/* Test hook: replace the monotonic clock (nanoseconds) the rate limiter
 * reads; NULL restores CLOCK_MONOTONIC. Also forgets all rate-limit state. */
void core_log_set_clock(uint64_t (*now_ns)(void));

/* ---- hashing ------------------------------------------------------------
 * core_hasher: a streaming 64-bit hash over 8-byte words (a multiply-xorshift
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

/* 64-bit FNV-1a, for the schedule hash and name hashing (SPEC §5). */
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

/* Happens-before annotations for synchronisation ThreadSanitizer cannot see
 * (liburcu's grace periods and wfcqueue are not instrumented). */
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define CORE_TSAN_RELEASE(addr) __tsan_release((void *)(addr))
#define CORE_TSAN_ACQUIRE(addr) __tsan_acquire((void *)(addr))
#else
#define CORE_TSAN_RELEASE(addr) ((void)(addr))
#define CORE_TSAN_ACQUIRE(addr) ((void)(addr))
#endif

#endif
