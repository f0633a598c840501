/*
 * core/grow.c -- the one way arrays grow (core.h, "growable arrays"):
 * capacity doubling from a minimum, overflow of the byte size refused,
 * optional zeroing of the new elements, nothing changed on failure.
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

size_t core_grow_cap(size_t cap, size_t need, size_t min_cap)
{
    size_t c = cap ? cap : min_cap ? min_cap : 1;
    while (c < need) {
        if (c > SIZE_MAX / 2)
            return SIZE_MAX;
        c *= 2;
    }
    return c;
}

int core_resize(void *arrp, size_t n, size_t new_n, size_t elem, bool zero)
{
    if (elem && new_n > SIZE_MAX / elem)
        return KEEL_ENOMEM;
    void *p;
    memcpy(&p, arrp, sizeof p); /* *arrp is a pointer to some element type */
    void *q = realloc(p, new_n * elem);
    if (!q)
        return KEEL_ENOMEM;
    if (zero && new_n > n)
        memset((unsigned char *)q + n * elem, 0, (new_n - n) * elem);
    memcpy(arrp, &q, sizeof q);
    return KEEL_OK;
}

int core_grow(void *arrp, uint32_t *cap, uint32_t need, size_t elem, uint32_t min_cap, bool zero)
{
    if (need <= *cap)
        return KEEL_OK;
    size_t c = core_grow_cap(*cap, need, min_cap);
    uint32_t c32 = c > UINT32_MAX ? UINT32_MAX : (uint32_t)c;
    int rc = core_resize(arrp, *cap, c32, elem, zero);
    if (!rc)
        *cap = c32;
    return rc;
}

int core_grow_size(void *arrp, size_t *cap, size_t need, size_t elem, size_t min_cap, bool zero)
{
    if (need <= *cap)
        return KEEL_OK;
    size_t c = core_grow_cap(*cap, need, min_cap);
    int rc = core_resize(arrp, *cap, c, elem, zero);
    if (!rc)
        *cap = c;
    return rc;
}
