/*
 * core/thread.c -- names for the runtime's threads, so that top -H, ps -L,
 * perf, gdb and /proc/<pid>/task/<tid>/comm tell a worker from the WAL
 * writer (docs/architecture.md "Threads"). The creator names the thread
 * right after pthread_create, so anyone who looks once the create call has
 * returned sees the name (the thread may run a moment under its creator's).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

#include "core/core.h"

void core_thread_name(pthread_t thread, const char *fmt, ...)
{
    char name[16]; /* the kernel's limit, NUL included: longer names are cut */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    pthread_setname_np(thread, name); /* a name is a debugging aid: failure changes nothing */
}
