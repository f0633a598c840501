/*
 * keel/version.h -- the version of the keel headers and of the library.
 *
 * The numbers below are the project version of CMakeLists.txt
 * (`project(keel VERSION ...)`): configuring fails when they differ
 * (cmake/check_version.cmake), so the headers, the library's SONAME, keel.pc
 * and the CMake package always carry one version. docs/api-stability.md says
 * what a version promises.
 *
 * KEEL_VERSION_* tell what a program was compiled against; keel_version()
 * tells which library it runs with (a shared libkeel may be newer than the
 * headers a program was built with, within one SONAME).
 */
#ifndef KEEL_VERSION_H
#define KEEL_VERSION_H

#ifdef __cplusplus
extern "C" {
#endif

#define KEEL_VERSION_MAJOR 0
#define KEEL_VERSION_MINOR 2
#define KEEL_VERSION_PATCH 0
#define KEEL_VERSION_STRING "0.2.0"

/* One number that orders versions: MAJOR * 10000 + MINOR * 100 + PATCH
 * (e.g. #if KEEL_VERSION_NUMBER >= 200). */
#define KEEL_VERSION_NUMBER (KEEL_VERSION_MAJOR * 10000 + KEEL_VERSION_MINOR * 100 + KEEL_VERSION_PATCH)

/* The version of the library the program runs with, "MAJOR.MINOR.PATCH"
 * (KEEL_VERSION_STRING of the library's build). Thread-safe, never NULL,
 * static storage; cannot fail. */
const char *keel_version(void);

#ifdef __cplusplus
}
#endif
#endif
