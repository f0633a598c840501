/*
 * Shared helpers for the Check suites. Each test program defines its suites
 * and calls KEEL_TEST_MAIN with their constructors; CK_RUN_SUITE (set by
 * CTest) picks one.
 */
#ifndef KEEL_TEST_H
#define KEEL_TEST_H

#include <check.h>
#include <stdlib.h>

#include "keel/keel.h"

/* Assert a keel call returned rc, printing the last error otherwise. */
#define ck_assert_rc(expr, rc)                                                   \
    do {                                                                         \
        int ck_rc_ = (expr);                                                     \
        ck_assert_msg(ck_rc_ == (rc), "%s returned %s (%d), expected %s: %s",     \
                      #expr, keel_strerror(ck_rc_), ck_rc_, keel_strerror(rc),   \
                      keel_last_error());                                        \
    } while (0)
#define ck_assert_ok(expr) ck_assert_rc((expr), KEEL_OK)

/* A new schedule on rt (the runtime frees it once installed). */
static inline keel_schedule *sched_new(keel_runtime *rt)
{
    keel_schedule *s = NULL;
    ck_assert_ok(keel_schedule_create(rt, &s));
    ck_assert_ptr_nonnull(s);
    return s;
}

/* Add a system, failing the test with the system's name on error. */
static inline keel_system add_sys(keel_schedule *s, const keel_system_desc *d)
{
    keel_system id = UINT32_MAX;
    int rc = keel_schedule_add_system(s, d, &id);
    ck_assert_msg(rc == KEEL_OK, "add_system '%s': %s: %s", d->name, keel_strerror(rc), keel_last_error());
    return id;
}

typedef Suite *(*keel_suite_fn)(void);

/* Failure messages may carry a child process's output (keel-crash's
 * keeps 64 KiB of it): above Check's default 4 KiB a message is replaced
 * by "Message string too long", and the evidence is lost. */
#define KEEL_TEST_MAX_MSG (1u << 18)

static inline int keel_test_run(keel_suite_fn *suites, int n)
{
    check_set_max_msg_size(KEEL_TEST_MAX_MSG);
    SRunner *sr = srunner_create(suites[0]());
    for (int i = 1; i < n; i++)
        srunner_add_suite(sr, suites[i]());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#define KEEL_TEST_MAIN(...)                                                      \
    int main(void)                                                               \
    {                                                                            \
        keel_suite_fn suites_[] = {__VA_ARGS__};                                 \
        return keel_test_run(suites_, (int)(sizeof suites_ / sizeof suites_[0])); \
    }

#endif
