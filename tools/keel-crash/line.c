/*
 * line.c -- keel-world's report lines: `kind key=value key=value ...`, one
 * line per write(2). Parsing is strict: a malformed line is reported by the
 * caller as a protocol break, never guessed at.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kc.h"

bool kc_line_parse(kc_line *l, const char *text, size_t len)
{
    if (len >= sizeof l->buf)
        return false;
    memcpy(l->buf, text, len);
    l->buf[len] = '\0';
    l->n = 0;
    char *save = NULL, *tok = strtok_r(l->buf, " ", &save);
    if (!tok)
        return false;
    l->kind = tok;
    while ((tok = strtok_r(NULL, " ", &save))) {
        char *eq = strchr(tok, '=');
        if (!eq || eq == tok || l->n == KC_MAX_FIELDS)
            return false;
        *eq = '\0';
        l->key[l->n] = tok;
        l->val[l->n++] = eq + 1;
    }
    return true;
}

const char *kc_get(const kc_line *l, const char *key)
{
    for (uint32_t i = 0; i < l->n; i++)
        if (!strcmp(l->key[i], key))
            return l->val[i];
    return NULL;
}

static bool parse_unsigned(const char *s, int base, uint64_t *out)
{
    if (!s || !*s || *s == '-' || *s == '+')
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, base);
    if (*end || errno)
        return false;
    *out = v;
    return true;
}

bool kc_get_u64(const kc_line *l, const char *key, uint64_t *out)
{
    return parse_unsigned(kc_get(l, key), 10, out);
}

bool kc_get_hex(const kc_line *l, const char *key, uint64_t *out)
{
    const char *s = kc_get(l, key);
    return s && strlen(s) == 16 && parse_unsigned(s, 16, out);
}

bool kc_get_i64(const kc_line *l, const char *key, int64_t *out)
{
    const char *s = kc_get(l, key);
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end || errno)
        return false;
    *out = v;
    return true;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Sorted, so that an account's items compare equal whatever order the
 * inventory lists them in (the order itself is covered by the state hash). */
char *kc_items_canon(const char *s, uint64_t *count)
{
    *count = 0;
    if (!s || !*s)
        return NULL;
    if (!strcmp(s, "-"))
        return strdup("-");
    size_t n = 1;
    for (const char *p = s; *p; p++)
        n += *p == ',';
    uint64_t *ids = malloc(n * sizeof *ids);
    char *out = malloc(n * 21 + 1);
    if (!ids || !out)
        goto fail;
    const char *p = s;
    for (size_t i = 0; i < n; i++) {
        char *end;
        errno = 0;
        if (*p < '0' || *p > '9')
            goto fail;
        ids[i] = strtoull(p, &end, 10);
        if (errno || (*end != ',' && *end != '\0') || (*end == '\0') != (i + 1 == n))
            goto fail;
        p = end + 1;
    }
    qsort(ids, n, sizeof *ids, cmp_u64);
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        o += (size_t)sprintf(out + o, "%s%" PRIu64, i ? "," : "", ids[i]);
    free(ids);
    *count = n;
    return out;
fail:
    free(ids);
    free(out);
    return NULL;
}

uint64_t kc_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t kc_rand(uint64_t *state)
{
    *state += 0x9e3779b97f4a7c15ull;
    return kc_mix(*state);
}

double kc_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}
