/*
 * core/name.c -- the names an application gives the library (components,
 * fields, systems, tracks, dags). They are stored and later written as they
 * are into text that must be UTF-8: Prometheus label values (a byte that is
 * not UTF-8 fails the whole scrape) and trace JSON. So they are checked once,
 * where they come in, by the rules below.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/core.h"

/* The offset of the first byte of s[0..n) that is a control character (C0
 * or DEL) or no part of a valid UTF-8 encoding -- overlong forms, surrogates
 * (U+D800-U+DFFF) and code points past U+10FFFF included -- or SIZE_MAX
 * when there is none. A character cut off by the end is bad at offset n. */
static size_t name_bad_at(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        if (c < 0x20 || c == 0x7f)
            return i;
        size_t len = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        if (!len)
            return i;
        /* the second byte's range is what rules out overlongs (E0, F0), surrogates (ED) and > U+10FFFF (F4) */
        unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80, hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
        for (size_t k = 1; k < len; k++, lo = 0x80, hi = 0xbf)
            if (i + k >= n || s[i + k] < lo || s[i + k] > hi)
                return i + k;
        i += len;
    }
    return SIZE_MAX;
}

int core_name_check(const char *name, size_t max, const char *what, ...)
{
    char w[192];
    va_list ap;
    va_start(ap, what);
    vsnprintf(w, sizeof w, what, ap);
    va_end(ap);
    if (!name)
        return core_fail(KEEL_EINVAL, "%s is missing (NULL)", w);
    size_t n = strlen(name), at = name_bad_at((const unsigned char *)name, n);
    if (!n || n > max)
        return core_fail(KEEL_EINVAL, "%s is %zu bytes long: a name has 1 to %zu", w, n, max);
    if (at == SIZE_MAX)
        return KEEL_OK;
    unsigned c = (unsigned char)name[at];
    if (at == n)
        return core_fail(KEEL_EINVAL, "%s is not valid UTF-8: it ends inside a character at byte %zu", w, at);
    if (c < 0x20 || c == 0x7f)
        return core_fail(KEEL_EINVAL, "%s holds control character 0x%02x at byte %zu: names are printable UTF-8", w, c,
                         at);
    return core_fail(KEEL_EINVAL, "%s is not valid UTF-8 at byte %zu (0x%02x): names are printable UTF-8", w, at, c);
}
