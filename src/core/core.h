/*
 * core/core.h -- internal helpers shared by every subsystem: setting the
 * thread-local last error, emitting diagnostics, growing arrays, hashing.
 */
#ifndef KEEL_CORE_H
#define KEEL_CORE_H

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <time.h>
#include <stddef.h>
#include <stdint.h>

#include "keel/error.h"

#if defined(__GNUC__)
#define CORE_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define CORE_LIKELY(x) __builtin_expect(!!(x), 1)
#define CORE_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define CORE_PRINTF(f, a)
#define CORE_LIKELY(x) (x)
#define CORE_UNLIKELY(x) (x)
#endif

/* Set the calling thread's last error to the formatted sentence and return
 * rc, so failures read `return core_fail(KEEL_EINVAL, "...", ...);`. */
int core_fail(int rc, const char *fmt, ...) CORE_PRINTF(2, 3);
/* core_fail whose sentence is the formatted prefix, ": " and the calling
 * thread's last error as it was: `return core_fail_prefix(rc, "cannot open
 * %s", dir);` wraps a callee's sentence in the caller's context. */
int core_fail_prefix(int rc, const char *fmt, ...) CORE_PRINTF(2, 3);
/* True once any core_fail(KEEL_ENOMEM, ...) happened in the process, on
 * any thread; never cleared. A reader that must not pass an incomplete
 * answer off as complete (keel-wal) asks at the end, however each failure
 * was handled on the way. */
bool core_out_of_memory_seen(void);

/* Check a name an application gives the library (a component, field,
 * system, track or dag): present, 1 to max bytes, valid UTF-8 (no overlong
 * form, surrogate or code point past U+10FFFF) and no control character (C0
 * or DEL). It is written as it is into Prometheus labels and trace JSON,
 * where anything else breaks the whole text. KEEL_OK, or KEEL_EINVAL with a
 * sentence that starts with `what` (formatted: "component 'pos': field 2's
 * name") and names the offending byte by its offset, never by its bytes. */
int core_name_check(const char *name, size_t max, const char *what, ...) CORE_PRINTF(3, 4);

/* Emit a diagnostic "subsystem/event fields" through the rate limiter.
 * fields is a printf format producing "key=value ..." pairs. */
void core_log(keel_log_level level, const char *subsystem, const char *event,
              const char *fields, ...) CORE_PRINTF(4, 5);

/* Name a thread just created (at most 15 characters are kept):
 * "keel-worker-1", "keel-wal-writer", ... (docs/architecture.md "Threads").
 * Only for a joinable thread not yet joined: a detached one may be gone. */
void core_thread_name(pthread_t thread, const char *fmt, ...) CORE_PRINTF(2, 3);

/* Where a worker thread may run (core/thread.c, "Placement"). */
typedef struct core_placement {
    cpu_set_t base;             /* the CPUs to spread over: the thread's affinity when it first had
                                   to move, or one set from outside since */
    cpu_set_t set;              /* the affinity this module last gave the thread */
    bool owned;                 /* set is the thread's affinity, as far as this module knows */
    uint32_t idle;              /* calls left to skip after finding nowhere to go */
} core_placement;

/* Start with nothing set (call on the thread, at its start). */
void core_placement_init(core_placement *pl);
/* The CPU the calling thread runs on, or -1 where the system cannot tell. */
int core_cpu_now(void);
/* If the calling thread runs on `cpu` (another thread's: the one that woke
 * it), move it off: its affinity becomes its base CPUs without `cpu`. True
 * when it set an affinity. Nothing happens for cpu < 0, when the thread is
 * elsewhere, or when `cpu` is its base's only CPU (then the next
 * CORE_PLACEMENT_IDLE calls that find it there again only return false). */
#define CORE_PLACEMENT_IDLE 1024u
bool core_placement_avoid(core_placement *pl, int cpu);

/* Test hook: replace the monotonic clock (nanoseconds) the rate limiter
 * reads; NULL restores CLOCK_MONOTONIC. Also forgets all rate-limit state. */
void core_log_set_clock(uint64_t (*now_ns)(void));

/* A spin-wait hint: the core yields its pipeline to a sibling and stops
 * speculating past the loop (nothing where the machine has no such hint). */
static inline void core_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t core_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* CLOCK_MONOTONIC nanoseconds as a timespec: the deadline of a timed wait
 * on a condition variable made by core_cond_init_monotonic. */
static inline struct timespec core_timespec_at(uint64_t ns)
{
    return (struct timespec){(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
}

/* A condition variable whose timed waits take CLOCK_MONOTONIC deadlines
 * (a wall-clock step moves none of them). */
static inline void core_cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

/* A mutex whose contenders spin a little before they sleep: for locks held
 * tens to hundreds of nanoseconds at a time, where a futex sleep and
 * wake-up (microseconds on a VM) would cost more than the wait
 * (docs/performance.md, "Design measurements"). */
static inline void core_mutex_init_adaptive(pthread_mutex_t *m)
{
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
    pthread_mutex_init(m, &ma);
    pthread_mutexattr_destroy(&ma);
}

/* The anchored clock (core/clock.c): CLOCK_MONOTONIC nanoseconds from the
 * TSC, for timestamps taken per system. Anchored by its owner's thread when
 * no other thread reads it (the protocol is at the definition); read by
 * any thread the anchor happened-before. Zero = no anchor yet: a reading is
 * clock_gettime until two anchors give the TSC's rate. */
typedef struct core_clock {
    uint64_t ns, tsc;         /* the last anchor: the real clock and the TSC at one instant */
    uint64_t mult;            /* nanoseconds per TSC tick, 32.32 fixed point; 0 = read the real clock */
    uint64_t ref_ns, ref_tsc; /* the anchor the TSC's rate is measured from */
    uint64_t rate;            /* the last rate measured (mult once an anchor is clean) */
    bool checked, usable;     /* whether the TSC is invariant (asked once) */
} core_clock;

/* Anchor c to the real clock now; returns the real clock's reading. */
uint64_t core_clock_anchor(core_clock *c);

/* TSC ticks in nanoseconds at mult (32.32 fixed point). */
static inline uint64_t core_clock_scale(uint64_t ticks, uint64_t mult)
{
    return (uint64_t)(((unsigned __int128)ticks * mult) >> 32);
}

static inline uint64_t core_clock_ns(const core_clock *c)
{
#if defined(__x86_64__)
    if (c->mult) {
        uint64_t t = __builtin_ia32_rdtsc();
        return c->ns + core_clock_scale(t > c->tsc ? t - c->tsc : 0, c->mult); /* a TSC behind: the anchor */
    }
#endif
    return core_now_ns();
}

/* The same, read only once the loads before it are done: for a stamp that
 * must not precede another core's stamp this thread has just seen the
 * effects of (rdtsc alone may run ahead of them; the lfence costs ~15 ns
 * in a loop that has cache misses in flight, so only where it matters;
 * clock_gettime orders its own read). */
static inline uint64_t core_clock_ns_fenced(const core_clock *c)
{
#if defined(__x86_64__)
    if (c->mult)
        __builtin_ia32_lfence();
#endif
    return core_clock_ns(c);
}

/* The worker pool as the layers below runtime/ see it: run fn(arg, i,
 * worker) for every i in [0, n) on the pool's workers and return when all
 * ran; or post them: start them on the workers and return at once, the one
 * that runs the last index then calling finish(arg); join returns once a
 * posted job has finished, the caller helping with what is left (only the
 * thread that steps posts and joins, one job at a time, and runs or posts
 * nothing else in between). runtime/ hands one in (sched/dispatch.c runs
 * it); `workers` bounds the worker index. A zeroed pool runs everything on
 * the caller, a posted job before post returns. */
typedef void (*core_task_fn)(void *arg, uint32_t i, uint32_t worker);
typedef struct core_pool {
    void (*run)(void *self, uint32_t n, core_task_fn fn, void *arg);
    void (*post)(void *self, uint32_t n, core_task_fn fn, void (*finish)(void *arg), void *arg);
    void (*join)(void *self);
    void *self;
    uint32_t workers;
} core_pool;

static inline void core_pool_run(const core_pool *p, uint32_t n, core_task_fn fn, void *arg)
{
    if (p->run && n > 1) {
        p->run(p->self, n, fn, arg);
        return;
    }
    for (uint32_t i = 0; i < n; i++)
        fn(arg, i, 0);
}

static inline void core_pool_post(const core_pool *p, uint32_t n, core_task_fn fn, void (*finish)(void *arg),
                                  void *arg)
{
    if (p->post) {
        p->post(p->self, n, fn, finish, arg);
        return;
    }
    for (uint32_t i = 0; i < n; i++)
        fn(arg, i, 0);
    finish(arg);
}

static inline void core_pool_join(const core_pool *p)
{
    if (p->join)
        p->join(p->self);
}

/* ---- task ranges (core/ranges.c) ----
 *
 * The tasks of a parallel piece of work cut into contiguous ranges, range w
 * the home of worker w: core_range_set fills range i (before the workers may
 * claim), core_range_claim gives worker `worker` its next task -- from the
 * front of its home, then stolen from the back of the fullest range --
 * or UINT32_MAX when every range is empty. *home is the claimer's state:
 * UINT32_MAX before its first claim. */
void core_range_set(_Atomic uint64_t *range, uint32_t lo, uint32_t hi);
uint32_t core_range_claim(_Atomic uint64_t *ranges, uint32_t n, uint32_t *home, uint32_t worker);

/* ---- growable arrays (core/grow.c) ----
 *
 * An array is a pointer to its elements and a capacity (in elements). The
 * helpers take the address of the pointer (any element type: `&w->tables`),
 * realloc it and write it back only on success: on KEEL_ENOMEM (realloc
 * failed, or the byte size does not fit a size_t) nothing changed. They do
 * not set the last error: the caller names what it was growing. */

/* The capacity to grow to for `need` elements: cap (min_cap when 0)
 * doubled until it holds need; SIZE_MAX when doubling overflows. */
size_t core_grow_cap(size_t cap, size_t need, size_t min_cap);
/* Resize the array at *arrp from n to new_n elements of elem bytes; zero:
 * elements n .. new_n are zeroed. */
int core_resize(void *arrp, size_t n, size_t new_n, size_t elem, bool zero);
/* Make the array at *arrp (capacity *cap) hold need elements: when it
 * does not, it grows to core_grow_cap(*cap, need, min_cap) and *cap is
 * updated. A uint32_t capacity stops at UINT32_MAX. */
int core_grow(void *arrp, uint32_t *cap, uint32_t need, size_t elem, uint32_t min_cap, bool zero);
int core_grow_size(void *arrp, size_t *cap, size_t need, size_t elem, size_t min_cap, bool zero);

/* CORE_GROW(arr, cap, need, min_cap): core_grow or core_grow_size (after
 * the type of cap, an lvalue) for the array arr (an lvalue pointer), its
 * element size taken from arr. CORE_GROW_ZEROED also zeroes the new
 * elements. Both evaluate to KEEL_OK or KEEL_ENOMEM. */
#define CORE_GROW_(arr, cap, need, min_cap, zero)                                            \
    _Generic(&(cap), uint32_t *: core_grow, default: core_grow_size)(&(arr), &(cap), (need), \
                                                                      sizeof *(arr), (min_cap), (zero))
#define CORE_GROW(arr, cap, need, min_cap) CORE_GROW_(arr, cap, need, min_cap, false)
#define CORE_GROW_ZEROED(arr, cap, need, min_cap) CORE_GROW_(arr, cap, need, min_cap, true)

#include "core/hash.h"

/* Happens-before annotations for synchronisation ThreadSanitizer cannot see
 * (liburcu's grace periods and wfcqueue are not instrumented). */
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define CORE_TSAN_RELEASE(addr) __tsan_release((void *)(addr))
#define CORE_TSAN_ACQUIRE(addr) __tsan_acquire((void *)(addr))
#else
#define CORE_TSAN_RELEASE(addr) ((void)(addr))
#define CORE_TSAN_ACQUIRE(addr) ((void)(addr))
#endif

#endif
