/*
 * test_core -- status codes, the thread-local last error, diagnostics with
 * rate limiting, the hash functions (known answers pinned), and the array
 * grower (core/grow.c), the anchored clock (core/clock.c), and a worker's
 * placement off another thread's CPU (core/thread.c).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "keel_test.h"

/* ---- error ---------------------------------------------------------------- */

START_TEST(strerror_names_every_code)
{
    static const struct { int rc; const char *name; } codes[] = {
        {KEEL_OK, "KEEL_OK"},         {KEEL_EINVAL, "KEEL_EINVAL"},     {KEEL_ESTALE, "KEEL_ESTALE"},
        {KEEL_ECONFLICT, "KEEL_ECONFLICT"}, {KEEL_EIO, "KEEL_EIO"},     {KEEL_ENOSPC, "KEEL_ENOSPC"},
        {KEEL_ECORRUPT, "KEEL_ECORRUPT"}, {KEEL_EBUSY, "KEEL_EBUSY"},   {KEEL_ETIMEDOUT, "KEEL_ETIMEDOUT"},
        {KEEL_EFATAL, "KEEL_EFATAL"},   {KEEL_ENOMEM, "KEEL_ENOMEM"},   {KEEL_ENOENT, "KEEL_ENOENT"},
        {KEEL_EEXIST, "KEEL_EEXIST"},   {KEEL_ERANGE, "KEEL_ERANGE"},
    };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        ck_assert_str_eq(keel_strerror(codes[i].rc), codes[i].name);
    ck_assert_str_eq(keel_strerror(-999), "KEEL_E?");
    ck_assert_str_eq(keel_strerror(5), "KEEL_E?");
}
END_TEST

START_TEST(failing_call_leaves_a_sentence_naming_the_culprit)
{
    keel_world *w;
    ck_assert_ok(keel_world_create(NULL, &w));
    keel_field f = {.name = "x", .type = KEEL_F32};
    keel_component c;
    ck_assert_ok(keel_component_register(w, &(keel_component_desc){.name = "speed", .size = 4, .fields = &f, .field_count = 1}, &c));
    keel_entity bogus = KEEL_ENTITY_MAKE(7, 3);
    float v = 1;
    ck_assert_rc(keel_set(w, bogus, c, &v), KEEL_ESTALE);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "0x0000000300000007"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "keel_set"));
    /* A later success does not clear it; the next failure replaces it. */
    ck_assert_ok(keel_component_lookup(w, "speed", &c));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "keel_set"));
    ck_assert_rc(keel_component_lookup(w, "nope", &c), KEEL_ENOENT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "'nope'"));
    keel_world_destroy(w);
}
END_TEST

START_TEST(core_fail_returns_its_code_and_truncates_safely)
{
    char big[2000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    ck_assert_int_eq(core_fail(KEEL_EIO, "file %s", big), KEEL_EIO);
    size_t n = strlen(keel_last_error());
    ck_assert_uint_gt(n, 100);
    ck_assert_uint_lt(n, sizeof big);
    ck_assert(strncmp(keel_last_error(), "file xxx", 8) == 0);
}
END_TEST

static Suite *error_suite(void)
{
    Suite *s = suite_create("error");
    TCase *tc = tcase_create("error");
    tcase_add_test(tc, strerror_names_every_code);
    tcase_add_test(tc, failing_call_leaves_a_sentence_naming_the_culprit);
    tcase_add_test(tc, core_fail_returns_its_code_and_truncates_safely);
    suite_add_tcase(s, tc);
    return s;
}

/* ---- log ------------------------------------------------------------------- */

typedef struct captured {
    int n;
    keel_log_level level[64];
    char line[64][128];
    uint64_t suppressed[64];
} captured;

static void capture(const keel_log_event *ev, void *user)
{
    captured *c = user;
    if (c->n < 64) {
        c->level[c->n] = ev->level;
        c->suppressed[c->n] = ev->suppressed;
        snprintf(c->line[c->n], sizeof c->line[0], "%s/%s %s", ev->subsystem, ev->event, ev->fields);
    }
    c->n++;
}

static uint64_t fake_now;
static uint64_t fake_clock(void)
{
    return fake_now;
}

static void log_setup(void)
{
    fake_now = 5000000000ull;
    core_log_set_clock(fake_clock);
}

static void log_teardown(void)
{
    core_log_set_clock(NULL);
    keel_log_set(NULL, NULL, KEEL_LOG_INFO);
}

START_TEST(events_reach_the_handler_structured)
{
    captured cap = {0};
    keel_log_set(capture, &cap, KEEL_LOG_DEBUG);
    core_log(KEEL_LOG_WARN, "wal", "slow_sync", "lsn=%d ms=%d", 42, 7);
    ck_assert_int_eq(cap.n, 1);
    ck_assert_int_eq(cap.level[0], KEEL_LOG_WARN);
    ck_assert_str_eq(cap.line[0], "wal/slow_sync lsn=42 ms=7");
    ck_assert_uint_eq(cap.suppressed[0], 0);
}
END_TEST

START_TEST(events_below_the_minimum_level_are_dropped)
{
    captured cap = {0};
    keel_log_set(capture, &cap, KEEL_LOG_WARN);
    core_log(KEEL_LOG_INFO, "t", "info", "a=1");
    core_log(KEEL_LOG_DEBUG, "t", "debug", "a=1");
    core_log(KEEL_LOG_ERROR, "t", "error", "a=1");
    ck_assert_int_eq(cap.n, 1);
    ck_assert_str_eq(cap.line[0], "t/error a=1");
}
END_TEST

START_TEST(rate_limit_counts_and_reports_suppressed_events)
{
    captured cap = {0};
    keel_log_set(capture, &cap, KEEL_LOG_DEBUG);
    for (int i = 0; i < 25; i++)
        core_log(KEEL_LOG_WARN, "cmd", "ignored_stale", "i=%d", i);
    ck_assert_int_eq(cap.n, KEEL_LOG_BURST);
    /* Another pair is limited separately. */
    core_log(KEEL_LOG_WARN, "cmd", "other", "x=1");
    ck_assert_int_eq(cap.n, KEEL_LOG_BURST + 1);
    /* Same window: still suppressed. */
    fake_now += 999999999ull;
    core_log(KEEL_LOG_WARN, "cmd", "ignored_stale", "i=%d", 25);
    ck_assert_int_eq(cap.n, KEEL_LOG_BURST + 1);
    /* Next window: delivered, carrying the 16 dropped ones. */
    fake_now += 1;
    core_log(KEEL_LOG_WARN, "cmd", "ignored_stale", "i=%d", 26);
    ck_assert_int_eq(cap.n, KEEL_LOG_BURST + 2);
    ck_assert_uint_eq(cap.suppressed[KEEL_LOG_BURST + 1], 16);
    ck_assert_str_eq(cap.line[KEEL_LOG_BURST + 1], "cmd/ignored_stale i=26");
    core_log(KEEL_LOG_WARN, "cmd", "ignored_stale", "i=%d", 27);
    ck_assert_uint_eq(cap.suppressed[KEEL_LOG_BURST + 2], 0);
}
END_TEST

START_TEST(many_pairs_do_not_break_the_table)
{
    /* More distinct pairs than table slots: each still gets delivered. */
    static const char events[100][8];
    captured cap = {0};
    keel_log_set(capture, &cap, KEEL_LOG_DEBUG);
    for (int i = 0; i < 100; i++)
        core_log(KEEL_LOG_INFO, "many", events[i], "i=%d", i);
    ck_assert_int_eq(cap.n, 100);
}
END_TEST

static Suite *log_suite(void)
{
    Suite *s = suite_create("log");
    TCase *tc = tcase_create("log");
    tcase_add_checked_fixture(tc, log_setup, log_teardown);
    tcase_add_test(tc, events_reach_the_handler_structured);
    tcase_add_test(tc, events_below_the_minimum_level_are_dropped);
    tcase_add_test(tc, rate_limit_counts_and_reports_suppressed_events);
    tcase_add_test(tc, many_pairs_do_not_break_the_table);
    suite_add_tcase(s, tc);
    return s;
}

/* ---- hash ------------------------------------------------------------------ */

START_TEST(fnv1a_known_answers)
{
    ck_assert_uint_eq(core_fnv1a64(CORE_FNV1A64_INIT, "", 0), 0xcbf29ce484222325ull);
    ck_assert_uint_eq(core_fnv1a64(CORE_FNV1A64_INIT, "a", 1), 0xaf63dc4c8601ec8cull);
    ck_assert_uint_eq(core_fnv1a64(CORE_FNV1A64_INIT, "foobar", 6), 0x85944171f73967e8ull);
}
END_TEST

static uint64_t hash_of(const void *p, size_t n)
{
    core_hasher h;
    core_hasher_init(&h, 1);
    core_hasher_bytes(&h, p, n);
    return core_hasher_final(&h);
}

START_TEST(hasher_known_answers)
{
    /* Pinned: the state hash is built on this function, so changing it
     * changes every recorded state hash. Update only with a format change. */
    ck_assert_uint_eq(hash_of("", 0), 0x445018e305810b78ull);
    ck_assert_uint_eq(hash_of("keel", 4), 0xbab82335973c7e5eull);
    ck_assert_uint_eq(hash_of("0123456789abcdef!", 17), 0x32a29b808cd84659ull);
}
END_TEST

START_TEST(hasher_is_sensitive_to_bits_order_and_length)
{
    unsigned char buf[64] = {0};
    uint64_t base = hash_of(buf, sizeof buf);
    for (int bit = 0; bit < 64 * 8; bit += 37) {
        buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        ck_assert_uint_ne(hash_of(buf, sizeof buf), base);
        buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
    }
    ck_assert_uint_ne(hash_of(buf, 63), base);
    ck_assert_uint_ne(hash_of("ab", 2), hash_of("ab\0", 3));
    ck_assert_uint_ne(hash_of("abcdefgh12345678", 16), hash_of("12345678abcdefgh", 16));
    /* Streaming u64 equals feeding the same 8 little-endian bytes. */
    core_hasher a, b;
    core_hasher_init(&a, 9);
    core_hasher_init(&b, 9);
    uint64_t v = 0x0102030405060708ull;
    core_hasher_u64(&a, v);
    core_hasher_bytes(&b, &v, 8);
    ck_assert_uint_eq(core_hasher_final(&a), core_hasher_final(&b));
}
END_TEST

/* The change digest sees every bit of every block and of the tail, the
 * order of the 8-byte words within a 32-byte block, and the length, and is
 * the same for the same bytes wherever they lie in memory. */
START_TEST(digest_is_sensitive_to_bits_order_and_length)
{
    unsigned char buf[100 + 8] = {0};
    for (size_t len = 0; len <= 100; len += len < 40 ? 1 : 20) {
        uint64_t base = core_digest64(buf, len);
        for (size_t bit = 0; bit < len * 8; bit += 7) {
            buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
            ck_assert_msg(core_digest64(buf, len) != base, "length %zu, bit %zu", len, bit);
            buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        }
        if (len)
            ck_assert_uint_ne(core_digest64(buf, len - 1), base);
    }
    ck_assert_uint_ne(core_digest64("abcdefgh12345678ABCDEFGH87654321", 32),
                      core_digest64("12345678abcdefgh87654321ABCDEFGH", 32));
    memcpy(buf + 3, "a checkpoint chunk of some length", 33);
    ck_assert_uint_eq(core_digest64(buf + 3, 33), core_digest64("a checkpoint chunk of some length", 33));
}
END_TEST

static Suite *hash_suite(void)
{
    Suite *s = suite_create("hash");
    TCase *tc = tcase_create("hash");
    tcase_add_test(tc, fnv1a_known_answers);
    tcase_add_test(tc, hasher_known_answers);
    tcase_add_test(tc, hasher_is_sensitive_to_bits_order_and_length);
    tcase_add_test(tc, digest_is_sensitive_to_bits_order_and_length);
    suite_add_tcase(s, tc);
    return s;
}

/* ---- grow ------------------------------------------------------------------ */

START_TEST(grow_capacity_doubles_from_the_minimum)
{
    ck_assert_uint_eq(core_grow_cap(0, 1, 8), 8);
    ck_assert_uint_eq(core_grow_cap(0, 9, 8), 16);
    ck_assert_uint_eq(core_grow_cap(8, 9, 64), 16);  /* the minimum only starts an empty array */
    ck_assert_uint_eq(core_grow_cap(16, 100, 8), 128);
    ck_assert_uint_eq(core_grow_cap(0, 3, 0), 4);    /* no minimum: from 1 */
    ck_assert_uint_eq(core_grow_cap(SIZE_MAX / 2 + 1, SIZE_MAX, 8), SIZE_MAX); /* doubling overflows */
}
END_TEST

START_TEST(grow_keeps_the_elements_and_moves_the_capacity)
{
    uint64_t *a = NULL;
    uint32_t cap = 0;
    ck_assert_int_eq(CORE_GROW(a, cap, 1, 8), KEEL_OK);
    ck_assert_ptr_nonnull(a);
    ck_assert_uint_eq(cap, 8);
    for (uint32_t i = 0; i < cap; i++)
        a[i] = 1000 + i;
    uint64_t *before = a;
    ck_assert_int_eq(CORE_GROW(a, cap, 8, 64), KEEL_OK); /* already holds 8: nothing happens */
    ck_assert_ptr_eq(a, before);
    ck_assert_uint_eq(cap, 8);
    ck_assert_int_eq(CORE_GROW(a, cap, 9, 8), KEEL_OK);
    ck_assert_uint_eq(cap, 16);
    ck_assert_int_eq(CORE_GROW(a, cap, 100, 8), KEEL_OK);
    ck_assert_uint_eq(cap, 128);
    for (uint32_t i = 0; i < 8; i++)
        ck_assert_uint_eq(a[i], 1000 + i);
    a[127] = 7; /* the whole capacity is usable (ASan would say otherwise) */
    free(a);

    /* a size_t capacity (byte buffers) */
    unsigned char *b = NULL;
    size_t bcap = 0;
    ck_assert_int_eq(CORE_GROW(b, bcap, 300, 256), KEEL_OK);
    ck_assert_uint_eq(bcap, 512);
    memset(b, 0x5a, bcap);
    ck_assert_int_eq(core_grow_size(&b, &bcap, 513, 1, 256, false), KEEL_OK);
    ck_assert_uint_eq(bcap, 1024);
    for (size_t i = 0; i < 512; i++)
        ck_assert_uint_eq(b[i], 0x5a);
    free(b);
}
END_TEST

START_TEST(grow_zeroes_only_the_new_elements)
{
    uint32_t *a = NULL;
    uint32_t cap = 0;
    ck_assert_int_eq(CORE_GROW_ZEROED(a, cap, 4, 4), KEEL_OK);
    ck_assert_uint_eq(cap, 4);
    for (uint32_t i = 0; i < cap; i++) {
        ck_assert_uint_eq(a[i], 0);
        a[i] = 0xdeadbeef;
    }
    ck_assert_int_eq(CORE_GROW_ZEROED(a, cap, 5, 4), KEEL_OK);
    ck_assert_uint_eq(cap, 8);
    for (uint32_t i = 0; i < 4; i++)
        ck_assert_uint_eq(a[i], 0xdeadbeef);
    for (uint32_t i = 4; i < 8; i++)
        ck_assert_uint_eq(a[i], 0);

    /* an exact resize, by one, zeroed */
    ck_assert_int_eq(core_resize(&a, cap, cap + 1, sizeof *a, true), KEEL_OK);
    ck_assert_uint_eq(a[3], 0xdeadbeef);
    ck_assert_uint_eq(a[8], 0);
    free(a);
}
END_TEST

START_TEST(grow_overflow_is_enomem_and_leaves_the_array_untouched)
{
    uint64_t *a = NULL;
    uint32_t cap = 0;
    ck_assert_int_eq(CORE_GROW(a, cap, 2, 2), KEEL_OK);
    a[0] = 11;
    a[1] = 22;
    uint64_t *before = a;

    /* the byte size of the new capacity does not fit a size_t */
    size_t huge = SIZE_MAX / 2;
    ck_assert_int_eq(core_grow(&a, &cap, 3, huge, 2, true), KEEL_ENOMEM);
    ck_assert_ptr_eq(a, before);
    ck_assert_uint_eq(cap, 2);
    ck_assert_uint_eq(a[0], 11);
    ck_assert_uint_eq(a[1], 22);

    size_t scap = 2;
    ck_assert_int_eq(core_grow_size(&a, &scap, SIZE_MAX / 8 + 1, sizeof *a, 2, false), KEEL_ENOMEM);
    ck_assert_ptr_eq(a, before);
    ck_assert_uint_eq(scap, 2);
    ck_assert_int_eq(core_grow_size(&a, &scap, SIZE_MAX, sizeof *a, 2, false), KEEL_ENOMEM); /* doubling overflows */
    ck_assert_ptr_eq(a, before);
    ck_assert_uint_eq(scap, 2);

    ck_assert_int_eq(core_resize(&a, 2, SIZE_MAX / sizeof *a + 1, sizeof *a, true), KEEL_ENOMEM);
    ck_assert_ptr_eq(a, before);
    ck_assert_uint_eq(a[0], 11);
    ck_assert_uint_eq(a[1], 22);
    free(a);
}
END_TEST

static Suite *grow_suite(void)
{
    Suite *s = suite_create("grow");
    TCase *tc = tcase_create("grow");
    tcase_add_test(tc, grow_capacity_doubles_from_the_minimum);
    tcase_add_test(tc, grow_keeps_the_elements_and_moves_the_capacity);
    tcase_add_test(tc, grow_zeroes_only_the_new_elements);
    tcase_add_test(tc, grow_overflow_is_enomem_and_leaves_the_array_untouched);
    suite_add_tcase(s, tc);
    return s;
}

/* ---- the anchored clock (core/clock.c) ------------------------------------ */

/* Whether a reading of c lies between two readings of the real clock, give
 * or take tol_ns (the extrapolation's error). */
static bool clock_bracketed(const core_clock *c, uint64_t tol_ns)
{
    uint64_t a = core_now_ns(), x = core_clock_ns(c), b = core_now_ns();
    return x + tol_ns >= a && x <= b + tol_ns;
}

START_TEST(clock_without_a_rate_reads_the_real_clock)
{
    core_clock c = {0};
    ck_assert(clock_bracketed(&c, 0));
    uint64_t a = core_now_ns(), at = core_clock_anchor(&c), b = core_now_ns();
    ck_assert(at >= a && at <= b);
    ck_assert_uint_eq(c.mult, 0); /* one anchor measures no rate */
    ck_assert(clock_bracketed(&c, 0));
}
END_TEST

/* Anchors every 5 ms until the clock has a rate (after three of them),
 * for at most 20 s (a bound for a hang, not a speed: a loaded host may
 * preempt many anchors between their readings): false when it got none --
 * where the TSC is not invariant, or no anchor's pair of readings was tight
 * (clock_gettime a system call): the clock then reads the real clock, as
 * it must, and the test that needs a rate, named by `skipping` (NULL: no
 * line), says it was skipped. */
static bool clock_calibrated(core_clock *c, const char *skipping)
{
    uint64_t start = core_clock_anchor(c);
    while (!c->mult && core_now_ns() - start < 20000000000ull) {
        nanosleep(&(struct timespec){0, 5000000}, NULL);
        core_clock_anchor(c);
    }
    if (!c->mult && skipping)
        fprintf(stderr, "%s: SKIPPED, the clock measured no TSC rate\n", skipping);
    return c->mult != 0;
}

/* With a rate, readings stay with the real clock's: right after an anchor,
 * never before it, and 20 ms later within 20 us (a rate 0.1 % off would
 * be 20 us off by then; a first rate, measured over 5 ms, 2 us at most). */
START_TEST(clock_from_the_tsc_follows_the_real_clock)
{
    core_clock c = {0};
    if (!clock_calibrated(&c, "clock_from_the_tsc_follows_the_real_clock"))
        return;
    for (int i = 0; i < 10; i++) {
        uint64_t at = core_clock_anchor(&c);
        ck_assert_uint_ge(core_clock_ns(&c), at);
        for (int k = 0; k < 100; k++)
            ck_assert(clock_bracketed(&c, 20000));
        nanosleep(&(struct timespec){0, 20000000}, NULL);
        ck_assert(clock_bracketed(&c, 20000));
    }
}
END_TEST

/* Anchor c once 3 ms have passed on the real clock (waited for in naps:
 * a stall only makes it later); whether the anchor was clean, its pair of
 * readings tight (c->ns moves only then). */
static bool anchor_after_3ms(core_clock *c)
{
    uint64_t start = core_now_ns(), before = c->ns;
    while (core_now_ns() - start < 3000000)
        nanosleep(&(struct timespec){0, 500000}, NULL);
    core_clock_anchor(c);
    return c->ns != before;
}

/* The first rate comes after a few milliseconds of anchors, so a runtime's
 * stamps read the TSC from its first ticks on: of clean anchors (their pair
 * of readings tight: c.ns moves) at least 3 ms apart, waited for on the
 * real clock, the second measures a rate, unused until the third confirms
 * it. A stall between them only lengthens the spans. */
START_TEST(clock_has_a_rate_after_milliseconds)
{
    core_clock c = {0};
    core_clock_anchor(&c);
    if (!c.usable) {
        fprintf(stderr, "clock_has_a_rate_after_milliseconds: SKIPPED, the TSC is not invariant\n");
        return;
    }
    uint32_t clean = c.ns != 0;
    for (int i = 0; i < 200 && clean < 3; i++) {
        if (!anchor_after_3ms(&c))
            continue;
        if (++clean == 2) { /* measured, not yet used */
            ck_assert_uint_ne(c.rate, 0);
            ck_assert_uint_eq(c.mult, 0);
        }
    }
    if (clean < 3) {
        fprintf(stderr, "clock_has_a_rate_after_milliseconds: SKIPPED, no three anchors had tight pairs\n");
        return;
    }
    ck_assert_uint_ne(c.mult, 0);
    ck_assert(clock_bracketed(&c, 20000));
}
END_TEST

/* A restart of the measurement (every 2 s of anchors) keeps the rate it
 * had until the new span is long: the anchor 3 ms after the restart must
 * not replace a rate measured over seconds with one measured over 3 ms.
 * A clean anchor that came only 100 ms or more after the restart (split
 * pairs, a stalled thread) rightly measures again: the case restarts. */
START_TEST(clock_keeps_its_rate_across_a_restart)
{
    core_clock c = {0};
    if (!clock_calibrated(&c, "clock_keeps_its_rate_across_a_restart"))
        return;
    for (int attempt = 0; attempt < 10; attempt++) {
        uint64_t ref = c.ref_ns;
        for (int i = 0; i < 200 && c.ref_ns == ref; i++) { /* the restart: the reference moves to an anchor */
            nanosleep(&(struct timespec){0, 50000000}, NULL);
            core_clock_anchor(&c);
        }
        ck_assert_uint_ne(c.ref_ns, ref);
        uint64_t rate = c.rate;
        ck_assert_uint_ne(rate, 0);
        bool clean = false;
        for (int i = 0; i < 100 && !clean; i++) /* the next clean anchor, 3 ms on */
            clean = anchor_after_3ms(&c);
        ck_assert(clean);
        if (c.ns - c.ref_ns >= 100000000ull)
            continue;
        ck_assert_uint_eq(c.rate, rate);
        ck_assert_uint_eq(c.mult, rate);
        return;
    }
    ck_abort_msg("in 10 restarts no clean anchor came within 100 ms");
}
END_TEST

/* A rate that no longer predicts the real clock (as after a suspend) is
 * dropped at the next anchor: readings are the real clock's until a new
 * rate is measured. */
START_TEST(clock_drops_a_rate_that_mispredicts)
{
    core_clock c = {0};
    if (!clock_calibrated(&c, "clock_drops_a_rate_that_mispredicts"))
        return;
    c.rate += c.rate / 50; /* 2 % fast: 400 us off after the 20 ms below */
    c.mult = c.rate;
    nanosleep(&(struct timespec){0, 20000000}, NULL);
    ck_assert(!clock_bracketed(&c, 20000)); /* the test's premise: this rate is caught out */
    for (int i = 0; i < 100 && c.rate; i++) /* an anchor preempted between its readings judges nothing */
        core_clock_anchor(&c);
    ck_assert_uint_eq(c.rate, 0);
    ck_assert_uint_eq(c.mult, 0);
    ck_assert(clock_bracketed(&c, 0));
    ck_assert(clock_calibrated(&c, NULL)); /* and measured again */
    ck_assert(clock_bracketed(&c, 20000));
}
END_TEST

static Suite *clock_suite(void)
{
    Suite *s = suite_create("clock");
    TCase *tc = tcase_create("clock");
    tcase_set_timeout(tc, 60); /* two calibrations may take 20 s each on a loaded host */
    tcase_add_test(tc, clock_without_a_rate_reads_the_real_clock);
    tcase_add_test(tc, clock_from_the_tsc_follows_the_real_clock);
    tcase_add_test(tc, clock_has_a_rate_after_milliseconds);
    tcase_add_test(tc, clock_keeps_its_rate_across_a_restart);
    tcase_add_test(tc, clock_drops_a_rate_that_mispredicts);
    suite_add_tcase(s, tc);
    return s;
}

/* ---- threads (run under TSan in CI) ---------------------------------------- */

#define THREADS 4
#define ROUNDS 2000

static pthread_barrier_t start_line;

static void *fail_in_own_words(void *arg)
{
    int id = (int)(intptr_t)arg;
    pthread_barrier_wait(&start_line);
    for (int i = 0; i < ROUNDS; i++) {
        char want[64];
        core_fail(KEEL_EINVAL, "thread %d round %d", id, i);
        snprintf(want, sizeof want, "thread %d round %d", id, i);
        if (strcmp(keel_last_error(), want) != 0)
            return (void *)1;
    }
    return NULL;
}

START_TEST(last_error_is_per_thread)
{
    pthread_t t[THREADS];
    pthread_barrier_init(&start_line, NULL, THREADS);
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, fail_in_own_words, (void *)(intptr_t)i);
    for (int i = 0; i < THREADS; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        ck_assert_ptr_null(ret);
    }
    pthread_barrier_destroy(&start_line);
}
END_TEST

static void count_events(const keel_log_event *ev, void *user)
{
    uint64_t *counts = user; /* [0] delivered, [1] suppressed reported: handler calls are serialised */
    counts[0]++;
    counts[1] += ev->suppressed;
}

static void *log_a_lot(void *arg)
{
    (void)arg;
    pthread_barrier_wait(&start_line);
    for (int i = 0; i < ROUNDS; i++)
        core_log(KEEL_LOG_WARN, "threads", "storm", "i=%d", i);
    return NULL;
}

START_TEST(concurrent_logging_accounts_for_every_event)
{
    uint64_t counts[2] = {0, 0};
    log_setup();
    keel_log_set(count_events, counts, KEEL_LOG_DEBUG);
    pthread_t t[THREADS];
    pthread_barrier_init(&start_line, NULL, THREADS);
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, log_a_lot, NULL);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&start_line);
    ck_assert_uint_eq(counts[0], KEEL_LOG_BURST);
    /* One more window flushes the suppressed count: every event is accounted for. */
    fake_now += 2000000000ull;
    core_log(KEEL_LOG_WARN, "threads", "storm", "final");
    ck_assert_uint_eq(counts[0] + counts[1], (uint64_t)THREADS * ROUNDS + 1);
    log_teardown();
}
END_TEST

/* core_placement (core/thread.c, "Placement"): each check runs on a thread
 * of its own, whose affinity it may change, and reports its first failed
 * condition to the test thread (which alone calls ck_assert). */
typedef const char *(*placement_fn)(void);

#define PL_CHECK(cond)                                                                                        \
    do {                                                                                                      \
        if (!(cond))                                                                                          \
            return #cond;                                                                                     \
    } while (0)

static void *placement_thread(void *arg)
{
    return (void *)(*(placement_fn *)arg)();
}

static void on_own_thread(placement_fn fn)
{
    pthread_t t;
    void *failed;
    ck_assert_int_eq(pthread_create(&t, NULL, placement_thread, &fn), 0);
    ck_assert_int_eq(pthread_join(t, &failed), 0);
    ck_assert_msg(!failed, "failed: %s", (const char *)failed);
}

/* A fresh placement for the calling thread, and its affinity in *base. */
static bool placement_start(core_placement *pl, cpu_set_t *base)
{
    core_placement_init(pl);
    return !sched_getaffinity(0, sizeof *base, base);
}

static bool affinity_is(const cpu_set_t *want)
{
    cpu_set_t s;
    return !sched_getaffinity(0, sizeof s, &s) && CPU_EQUAL(&s, want);
}

/* Move off the CPU the thread runs on; *cpu: that CPU. The kernel may move
 * the thread between the look and the call, so a few tries. */
static bool avoid_here(core_placement *pl, int *cpu)
{
    for (int i = 0; i < 100; i++)
        if (core_placement_avoid(pl, *cpu = core_cpu_now()))
            return true;
    return false;
}

static const char *moves_off_the_named_cpu(void)
{
    core_placement pl;
    cpu_set_t base, want;
    PL_CHECK(placement_start(&pl, &base));
    int a = core_cpu_now(), b;
    PL_CHECK(a >= 0);
    if (CPU_COUNT(&base) < 2) { /* nowhere to go */
        PL_CHECK(!core_placement_avoid(&pl, a));
        PL_CHECK(affinity_is(&base));
        return NULL;
    }
    PL_CHECK(avoid_here(&pl, &a));
    want = base;
    CPU_CLR(a, &want);
    PL_CHECK(affinity_is(&want));
    PL_CHECK((b = core_cpu_now()) >= 0 && b != a); /* moved at once */
    /* found on b next: the base without b, a allowed again */
    PL_CHECK(avoid_here(&pl, &b));
    want = base;
    CPU_CLR(b, &want);
    PL_CHECK(affinity_is(&want) && CPU_ISSET(a, &want));
    return NULL;
}

static const char *stays_when_elsewhere(void)
{
    core_placement pl;
    cpu_set_t base;
    PL_CHECK(placement_start(&pl, &base));
    int here = core_cpu_now(), other = here == 0 ? 1 : 0;
    if (CPU_ISSET(other, &base) && CPU_COUNT(&base) > 1) { /* kept off `other` for the test */
        CPU_CLR(other, &base);
        PL_CHECK(!sched_setaffinity(0, sizeof base, &base));
    }
    PL_CHECK(!core_placement_avoid(&pl, -1));
    PL_CHECK(!core_placement_avoid(&pl, CPU_SETSIZE));
    PL_CHECK(!core_placement_avoid(&pl, other)); /* a CPU it does not run on */
    PL_CHECK(affinity_is(&base));
    return NULL;
}

static const char *keeps_an_operators_affinity(void)
{
    core_placement pl;
    core_placement_init(&pl);
    int a = core_cpu_now();
    PL_CHECK(a >= 0);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(a, &one);
    /* an operator narrows the thread to the CPU it runs on: that is the base
       now, and a placement never widens it back */
    PL_CHECK(!sched_setaffinity(0, sizeof one, &one));
    PL_CHECK(!core_placement_avoid(&pl, a));
    PL_CHECK(affinity_is(&one));
    return NULL;
}

static const char *keeps_an_operators_affinity_after_a_move(void)
{
    core_placement pl;
    cpu_set_t base, one;
    PL_CHECK(placement_start(&pl, &base));
    if (CPU_COUNT(&base) < 2)
        return NULL; /* no move to start from (moves_off_the_named_cpu covers one CPU) */
    int a;
    PL_CHECK(avoid_here(&pl, &a)); /* the placement owns the affinity now: the base without a */
    /* an operator then pins the thread to a, the CPU it left (an affinity this module cannot have
       set): found there, it stays */
    CPU_ZERO(&one);
    CPU_SET(a, &one);
    PL_CHECK(!sched_setaffinity(0, sizeof one, &one));
    PL_CHECK(core_cpu_now() == a);
    PL_CHECK(!core_placement_avoid(&pl, a));
    PL_CHECK(affinity_is(&one));
    return NULL;
}

START_TEST(placement_moves_a_thread_off_the_named_cpu)
{
    on_own_thread(moves_off_the_named_cpu);
}
END_TEST

START_TEST(placement_does_nothing_elsewhere)
{
    on_own_thread(stays_when_elsewhere);
}
END_TEST

START_TEST(placement_never_widens_an_operators_affinity)
{
    on_own_thread(keeps_an_operators_affinity);
    on_own_thread(keeps_an_operators_affinity_after_a_move);
}
END_TEST

/* ---- task ranges ----------------------------------------------------------------------------- */

/* Worker w claims its home range w from the front, then steals single tasks
 * from the back of the fullest range (the first of equals); a worker
 * without a home steals from the start; an empty set answers UINT32_MAX. */
START_TEST(ranges_claim_home_first_then_steal_from_the_fullest)
{
    _Atomic uint64_t r[3];
    core_range_set(&r[0], 0, 3);
    core_range_set(&r[1], 3, 6);
    core_range_set(&r[2], 6, 10);
    uint32_t home = UINT32_MAX, got[10], n = 0;
    for (uint32_t t; n < 10 && (t = core_range_claim(r, 3, &home, 1)) != UINT32_MAX;)
        got[n++] = t;
    /* home 3 4 5; then range 2 (4 left) from the back: 9; then ranges 0 and 2 have 3 each: the first, 2;
       then range 2 (3 left): 8; then 1 and 7, 0 and 6 */
    static const uint32_t want[10] = {3, 4, 5, 9, 2, 8, 1, 7, 0, 6};
    ck_assert_uint_eq(n, 10);
    ck_assert_mem_eq(got, want, sizeof want);
    ck_assert_uint_eq(home, 3); /* drained: a thief from now on */
    ck_assert_uint_eq(core_range_claim(r, 3, &home, 1), UINT32_MAX);

    core_range_set(&r[0], 0, 2);
    core_range_set(&r[1], 2, 2); /* an empty home */
    home = UINT32_MAX;
    ck_assert_uint_eq(core_range_claim(r, 2, &home, 1), 1); /* steals at once */
    home = UINT32_MAX;
    ck_assert_uint_eq(core_range_claim(r, 2, &home, 7), 0); /* no home of its own */
    ck_assert_uint_eq(home, 2);
    ck_assert_uint_eq(core_range_claim(r, 2, &home, 0), UINT32_MAX);
}
END_TEST

#define RANGE_THREADS 4
#define RANGE_TASKS 200000u
static _Atomic uint64_t g_ranges[RANGE_THREADS];
static _Atomic uint32_t g_claimed[RANGE_TASKS];
static _Atomic uint32_t g_range_go;

static void *range_claimer(void *arg)
{
    uint32_t worker = (uint32_t)(uintptr_t)arg, home = UINT32_MAX;
    while (!atomic_load(&g_range_go))
        sched_yield();
    for (uint32_t t; (t = core_range_claim(g_ranges, RANGE_THREADS, &home, worker)) != UINT32_MAX;)
        atomic_fetch_add_explicit(&g_claimed[t], 1, memory_order_relaxed);
    return NULL;
}

/* Four threads claiming from the front of their homes and stealing from
 * every back at once (homes of very different sizes, one empty): every
 * task is claimed exactly once. */
START_TEST(ranges_claim_every_task_exactly_once)
{
    static const uint32_t cut[RANGE_THREADS + 1] = {0, 150000, 150000, 150001, RANGE_TASKS};
    for (uint32_t w = 0; w < RANGE_THREADS; w++)
        core_range_set(&g_ranges[w], cut[w], cut[w + 1]);
    for (uint32_t t = 0; t < RANGE_TASKS; t++)
        atomic_store_explicit(&g_claimed[t], 0, memory_order_relaxed);
    atomic_store(&g_range_go, 0);
    pthread_t th[RANGE_THREADS];
    for (uintptr_t w = 0; w < RANGE_THREADS; w++)
        ck_assert_int_eq(pthread_create(&th[w], NULL, range_claimer, (void *)w), 0);
    atomic_store(&g_range_go, 1);
    for (int w = 0; w < RANGE_THREADS; w++)
        pthread_join(th[w], NULL);
    for (uint32_t t = 0; t < RANGE_TASKS; t++)
        if (atomic_load_explicit(&g_claimed[t], memory_order_relaxed) != 1)
            ck_abort_msg("task %u claimed %u times", t, atomic_load(&g_claimed[t]));
}
END_TEST

static Suite *threads_suite(void)
{
    Suite *s = suite_create("core_threads");
    TCase *tc = tcase_create("threads");
    tcase_add_test(tc, last_error_is_per_thread);
    tcase_add_test(tc, concurrent_logging_accounts_for_every_event);
    tcase_add_test(tc, ranges_claim_home_first_then_steal_from_the_fullest);
    tcase_add_test(tc, ranges_claim_every_task_exactly_once);
    suite_add_tcase(s, tc);
    TCase *pl = tcase_create("placement");
    tcase_add_test(pl, placement_moves_a_thread_off_the_named_cpu);
    tcase_add_test(pl, placement_does_nothing_elsewhere);
    tcase_add_test(pl, placement_never_widens_an_operators_affinity);
    suite_add_tcase(s, pl);
    return s;
}

KEEL_TEST_MAIN(error_suite, log_suite, hash_suite, grow_suite, clock_suite, threads_suite)
