/*
 * test_version -- the version a program was compiled against
 * (KEEL_VERSION_*, keel/version.h through keel/keel.h) and the one the
 * library reports (keel_version()) agree, and the parts make the string.
 * That they equal CMake's project version is checked when configuring
 * (cmake/check_version.cmake; its failure path: the version_check_detects
 * test).
 */
#include <stdio.h>
#include <string.h>

#include "keel_test.h"

START_TEST(library_reports_the_header_version)
{
    ck_assert_ptr_nonnull(keel_version());
    ck_assert_str_eq(keel_version(), KEEL_VERSION_STRING);
    /* static storage: the same pointer every time */
    ck_assert_ptr_eq(keel_version(), keel_version());
}
END_TEST

START_TEST(parts_make_the_string_and_the_number)
{
    char s[64];
    snprintf(s, sizeof s, "%d.%d.%d", KEEL_VERSION_MAJOR, KEEL_VERSION_MINOR, KEEL_VERSION_PATCH);
    ck_assert_str_eq(s, KEEL_VERSION_STRING);
    ck_assert_int_eq(KEEL_VERSION_NUMBER, KEEL_VERSION_MAJOR * 10000 + KEEL_VERSION_MINOR * 100 + KEEL_VERSION_PATCH);
    /* the number orders versions only while the minor and the patch stay below 100 */
    ck_assert_int_lt(KEEL_VERSION_MINOR, 100);
    ck_assert_int_lt(KEEL_VERSION_PATCH, 100);
}
END_TEST

static Suite *version_suite(void)
{
    Suite *s = suite_create("version");
    TCase *tc = tcase_create("version");
    tcase_add_test(tc, library_reports_the_header_version);
    tcase_add_test(tc, parts_make_the_string_and_the_number);
    suite_add_tcase(s, tc);
    return s;
}

KEEL_TEST_MAIN(version_suite)
