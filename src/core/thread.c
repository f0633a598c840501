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
 * CPUs without that one: two system calls (read and set the affinity), only
 * when it finds itself there. The base is the thread's affinity when it
 * first has to move. An affinity that differs from the one set here was set
 * from outside (taskset -a -p, a cpuset, a CPU taken offline) and becomes
 * the base, so a placement does not widen it -- also when it only narrowed
 * this module's (the CPU excluded then stays out), and unless it equals the
 * one set here last, which cannot be told from it. Where there is nowhere
 * to go (one CPU) the thread skips the check CORE_PLACEMENT_IDLE times
 * before it reads its affinity again.
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
    CPU_ZERO(&pl->base);
    CPU_ZERO(&pl->set);
    pl->owned = false;
    pl->idle = 0;
}

int core_cpu_now(void)
{
    return sched_getcpu(); /* glibc >= 2.35 reads it from rseq, else x86-64's vDSO: no system call */
}

bool core_placement_avoid(core_placement *pl, int cpu)
{
    if (cpu < 0 || cpu >= CPU_SETSIZE || core_cpu_now() != cpu)
        return false;
    if (pl->idle) {
        pl->idle--;
        return false;
    }
    cpu_set_t now, want;
    if (sched_getaffinity(0, sizeof now, &now))
        return false;
    if (!pl->owned || !CPU_EQUAL(&now, &pl->set))
        pl->base = now; /* set from outside: spread over that */
    want = pl->base;
    CPU_CLR(cpu, &want);
    if (!CPU_COUNT(&want)) {
        pl->idle = CORE_PLACEMENT_IDLE;
        return false;
    }
    if (CPU_EQUAL(&want, &now) || sched_setaffinity(0, sizeof want, &want))
        return false;
    pl->set = want;
    pl->owned = true;
    return true;
}
