/*
 * core/error.c -- status code names and the thread-local last error.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/core.h"

#define CORE_ERROR_MAX 512

static _Thread_local char last_error[CORE_ERROR_MAX];
static atomic_bool out_of_memory; /* a sticky flag: relaxed order is enough */

const char *keel_strerror(int rc)
{
    switch (rc) {
    case KEEL_OK:        return "KEEL_OK";
    case KEEL_EINVAL:    return "KEEL_EINVAL";
    case KEEL_ESTALE:    return "KEEL_ESTALE";
    case KEEL_ECONFLICT: return "KEEL_ECONFLICT";
    case KEEL_EIO:       return "KEEL_EIO";
    case KEEL_ENOSPC:    return "KEEL_ENOSPC";
    case KEEL_ECORRUPT:  return "KEEL_ECORRUPT";
    case KEEL_EBUSY:     return "KEEL_EBUSY";
    case KEEL_ETIMEDOUT: return "KEEL_ETIMEDOUT";
    case KEEL_EFATAL:    return "KEEL_EFATAL";
    case KEEL_ENOMEM:    return "KEEL_ENOMEM";
    case KEEL_ENOENT:    return "KEEL_ENOENT";
    case KEEL_EEXIST:    return "KEEL_EEXIST";
    case KEEL_ERANGE:    return "KEEL_ERANGE";
    case KEEL_EALREADY:  return "KEEL_EALREADY";
    case KEEL_EFENCED:   return "KEEL_EFENCED";
    case KEEL_EUNAVAILABLE: return "KEEL_EUNAVAILABLE";
    default:             return "KEEL_E?";
    }
}

const char *keel_last_error(void)
{
    return last_error;
}

int core_fail(int rc, const char *fmt, ...)
{
    if (rc == KEEL_ENOMEM)
        atomic_store_explicit(&out_of_memory, true, memory_order_relaxed);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return rc;
}

/* Append s to the string of length `at` in dst[cap], cutting it to fit. */
static size_t append(char *dst, size_t cap, size_t at, const char *s)
{
    size_t n = strlen(s);
    if (at + 1 >= cap)
        return at;
    if (n > cap - 1 - at)
        n = cap - 1 - at;
    memcpy(dst + at, s, n);
    dst[at + n] = 0;
    return at + n;
}

int core_fail_prefix(int rc, const char *fmt, ...)
{
    char cause[CORE_ERROR_MAX]; /* the prefix is formatted into last_error, the cause's home */
    memcpy(cause, last_error, sizeof cause);
    if (rc == KEEL_ENOMEM)
        atomic_store_explicit(&out_of_memory, true, memory_order_relaxed);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof last_error)
        append(last_error, sizeof last_error, append(last_error, sizeof last_error, (size_t)n, ": "), cause);
    return rc;
}

bool core_out_of_memory_seen(void)
{
    return atomic_load_explicit(&out_of_memory, memory_order_relaxed);
}
