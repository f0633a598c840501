/*
 * core/thread.c -- names for the runtime's threads, so that top -H, ps -L,
 * perf, gdb and /proc/<pid>/task/<tid>/comm tell a worker from the WAL
 * writer (docs/architecture.md "Threads"). The creator names the thread
 * right after pthread_create, so anyone who looks once the create call has
 * returned sees the name (the thread may run a moment under its creator's).
 *
 * Placement: the kernel puts a thread it wakes on the waker's CPU or on
 * the one the thread last ran on when it judges that CPU a good one. On
 * some machines (the virtual machine of docs/performance.md among them) it
 * does so while another CPU is idle, and a paced tick's bursts are too
 * short for its load balancer to part the two threads again: a 60 Hz
 * tick's workers then took turns with the stepping thread on one CPU
 * (docs/scheduling.md, "Worker placement"). A worker woken onto the
 * stepping thread's CPU therefore narrows its own affinity to its base
 * CPUs without that one -- a system call only when it finds itself there.
 * The base is the thread's affinity at its start; an affinity someone else
 * set since (taskset -p, a cpuset) becomes the base instead, so a
 * placement never widens what an operator set.
 */
#include <pthread.h>
#include <sched.h>
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

void core_placement_init(core_placement *pl)
{
    if (sched_getaffinity(0, sizeof pl->base, &pl->base))
        CPU_ZERO(&pl->base); /* unknown: core_placement_avoid then reads it again */
    pl->set = pl->base;
    pl->owned = false;
}

int core_cpu_now(void)
{
    return sched_getcpu(); /* glibc reads it from rseq: no system call */
}

bool core_placement_avoid(core_placement *pl, int cpu)
{
    if (cpu < 0 || cpu >= CPU_SETSIZE || core_cpu_now() != cpu)
        return false;
    cpu_set_t now, want;
    if (sched_getaffinity(0, sizeof now, &now))
        return false;
    if (!pl->owned || !CPU_EQUAL(&now, &pl->set))
        pl->base = now; /* set by someone else: spread over theirs */
    want = pl->base;
    CPU_CLR(cpu, &want);
    if (!CPU_COUNT(&want) || CPU_EQUAL(&want, &now) || sched_setaffinity(0, sizeof want, &want))
        return false;
    pl->set = want;
    pl->owned = true;
    return true;
}
