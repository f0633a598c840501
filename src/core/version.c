/*
 * core/version.c -- keel_version(): the version compiled into the library,
 * so that a program can compare it with the KEEL_VERSION_* it was built
 * against (a shared library is picked at run time).
 */
#include "keel/version.h"

const char *keel_version(void)
{
    return KEEL_VERSION_STRING;
}
