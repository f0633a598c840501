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
 * Only the arming thread counts down: the runtime's other threads (the
 * watchdog) allocate unharmed. Sanitizer runtimes replace malloc
 * themselves; in those builds this file defines nothing and
 * oom_shim_active() says so.
 */
#include "oom_shim.h"

#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)

bool oom_shim_active(void)
{
    return false;
}
void oom_arm(long k)
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

/* Thread-local: only the arming thread counts down (initial-exec TLS, so
 * reading it never allocates). */
static __thread long countdown __attribute__((tls_model("initial-exec")));
static __thread bool fired __attribute__((tls_model("initial-exec")));
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

bool oom_disarm(void)
{
    countdown = 0;
    return fired;
}

long oom_pause(void)
{
    long left = countdown;
    countdown = 0;
    return left;
}

void oom_resume(long left)
{
    countdown = left;
}

long oom_live(void)
{
    return atomic_load(&live);
}

/* True for the allocation that must fail. */
static bool fail_now(void)
{
    if (countdown <= 0 || --countdown)
        return false;
    fired = true;
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

int posix_memalign(void **out, size_t align, size_t n)
{
    void *p = memalign(align, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

#endif
