/* A version header that disagrees with the project version (0.2.0 when
 * this was written; the test passes any other): cmake/check_version.cmake
 * must refuse it (test version_check_detects). */
#define KEEL_VERSION_MAJOR 9
#define KEEL_VERSION_MINOR 8
#define KEEL_VERSION_PATCH 7
#define KEEL_VERSION_STRING "9.8.7"
