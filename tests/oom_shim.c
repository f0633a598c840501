/*
 * oom_shim.c -- allocation failure on demand, for tests/test_oom.c.
 *
 * The test program replaces malloc and its family (glibc supports this: a
 * program that defines malloc, free, calloc, realloc and the aligned
 * allocators gets them used by every library, glibc included) with thin
 * wrappers around glibc's own __libc_* allocator that
 *   - fail the k-th allocation made by the armed thread after oom_arm(k),
 *     once (SQLite's "one-shot" out-of-memory injection), and
 *   - count the blocks alive in the whole process, so a test can check that
 *     an operation that failed halfway freed what it had allocated.
 * oom_arm counts the arming thread only, so the runtime's other threads
 * (the watchdog, the WAL writer) allocate unharmed; oom_arm_all counts
 * every thread. Every allocator glibc documents as replaceable is
 * replaced (malloc_usable_size works on the blocks as they are glibc's).
 * Sanitizer runtimes replace malloc themselves; in those builds this file
 * defines nothing and oom_shim_active() says so.
 *
 * Built with OOM_PRELOAD it is also libkeel_oom_preload.so, preloaded
 * (LD_PRELOAD) into a tool run as a child: OOM_FAIL_AT=k in the
 * environment fails the k-th allocation of the process (any thread), and
 * at exit the file named by OOM_REPORT receives "fired=1" or "fired=0"
 * (written with open/write: nothing allocates there).
 */
#include "oom_shim.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)

bool oom_shim_active(void)
{
    return false;
}
void oom_arm(long k)
{
    (void)k;
}
void oom_arm_all(long k)
{
    (void)k;
}
bool oom_disarm(void)
{
    return false;
}
long oom_pause(void)
{
    return 0;
}
void oom_resume(long left)
{
    (void)left;
}
long oom_live(void)
{
    return 0;
}

#else

void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t n);
void __libc_free(void *p);
void *__libc_memalign(size_t align, size_t n);
void *__libc_valloc(size_t n);
void *__libc_pvalloc(size_t n);

/* Thread-local: only the arming thread counts down (initial-exec TLS, so
 * reading it never allocates). oom_arm_all counts every thread's
 * allocations instead, in one atomic countdown: the one whose decrement
 * takes it from 1 to 0 fails (later ones take it below 0 and pass), so
 * exactly one allocation fails, on whichever thread makes it. */
static __thread long countdown __attribute__((tls_model("initial-exec")));
static __thread bool fired __attribute__((tls_model("initial-exec")));
static atomic_long all_countdown;
static atomic_bool all_fired;
static bool all_mode; /* set and read by the arming thread only */
static atomic_long live;

bool oom_shim_active(void)
{
    return true;
}

void oom_arm(long k)
{
    fired = false;
    countdown = k;
}

void oom_arm_all(long k)
{
    atomic_store(&all_fired, false);
    all_mode = true;
    atomic_store(&all_countdown, k);
}

/* Called while the other threads are idle (between ticks): a thread in the
 * middle of the failing allocation could otherwise set all_fired late. */
bool oom_disarm(void)
{
    countdown = 0;
    atomic_store(&all_countdown, 0);
    bool f = all_mode ? atomic_load(&all_fired) : fired;
    all_mode = false;
    return f;
}

long oom_pause(void)
{
    if (all_mode)
        return atomic_exchange(&all_countdown, 0);
    long left = countdown;
    countdown = 0;
    return left;
}

void oom_resume(long left)
{
    if (all_mode)
        atomic_store(&all_countdown, left);
    else
        countdown = left;
}

long oom_live(void)
{
    return atomic_load(&live);
}

/* True for the allocation that must fail (errno ENOMEM, as glibc sets it). */
static bool fail_now(void)
{
    if (countdown > 0) {
        if (--countdown)
            return false;
        fired = true;
    } else {
        if (atomic_load_explicit(&all_countdown, memory_order_relaxed) <= 0 ||
            atomic_fetch_sub(&all_countdown, 1) != 1)
            return false;
        atomic_store(&all_fired, true);
    }
    errno = ENOMEM;
    return true;
}

static void *counted(void *p)
{
    if (p)
        atomic_fetch_add_explicit(&live, 1, memory_order_relaxed);
    return p;
}

void *malloc(size_t n)
{
    return fail_now() ? NULL : counted(__libc_malloc(n));
}

void *calloc(size_t n, size_t size)
{
    return fail_now() ? NULL : counted(__libc_calloc(n, size));
}

void free(void *p)
{
    if (p)
        atomic_fetch_sub_explicit(&live, 1, memory_order_relaxed);
    __libc_free(p);
}

/* realloc(NULL, n) allocates; realloc(p, 0) frees p (glibc) and returns
 * NULL; a failed realloc leaves p alive. */
void *realloc(void *p, size_t n)
{
    if (!p)
        return malloc(n);
    if (!n) {
        free(p);
        return NULL;
    }
    return fail_now() ? NULL : __libc_realloc(p, n);
}

void *memalign(size_t align, size_t n)
{
    return fail_now() ? NULL : counted(__libc_memalign(align, n));
}

void *aligned_alloc(size_t align, size_t n)
{
    return memalign(align, n);
}

void *valloc(size_t n)
{
    return fail_now() ? NULL : counted(__libc_valloc(n));
}

void *pvalloc(size_t n)
{
    return fail_now() ? NULL : counted(__libc_pvalloc(n));
}

int posix_memalign(void **out, size_t align, size_t n)
{
    void *p = memalign(align, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

#ifdef OOM_PRELOAD
__attribute__((constructor)) static void preload_arm(void)
{
    const char *k = getenv("OOM_FAIL_AT");
    if (k && atol(k) > 0)
        oom_arm_all(atol(k));
}

__attribute__((destructor)) static void preload_report(void)
{
    const char *path = getenv("OOM_REPORT");
    int fd = path ? open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644) : -1;
    if (fd < 0)
        return;
    const char *line = atomic_load(&all_fired) ? "fired=1\n" : "fired=0\n";
    ssize_t w = write(fd, line, 8);
    (void)w;
    close(fd);
}
#endif

#endif
