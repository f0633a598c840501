/*
 * sched/dispatch.c -- running one track's systems on the worker pool.
 *
 * Serial mode (workers = 1) walks the track's execution order on the caller:
 * the order is topological, so every predecessor has completed when a system
 * is reached.
 *
 * Parallel mode. The caller of keel_runtime_step is worker 0; nthreads more
 * threads are workers 1..nthreads. Per track:
 *
 *   caller: prepare  -> track_live = 1 -> epoch++ (futex wake) -> work loop
 *           -> remaining == 0 -> track_live = 0 -> wait until active == 0
 *   worker: wait for epoch change (futex) -> active++ -> if track_live and
 *           epoch unchanged: work loop -> active--
 *
 * A worker touches track state only between active++ and active--, and
 * only after seeing track_live set for the epoch it woke for. The caller
 * resets state only after it cleared track_live and saw active == 0. Both
 * sides use sequentially consistent accesses on (active, track_live), so
 * either the worker sees track_live == 0 and backs off, or the caller sees
 * active > 0 and waits: no worker ever works on a stale track.
 *
 * Ready queue: tickets[] are single-use slots, reset per track. A push takes
 * a slot with fetch_add(tail) and then stores the system id + 1 (release).
 * A pop reads head and tail and claims k = (tail - head) / workers slots
 * (1..POP_BATCH) with one CAS(head); it then waits for each claimed slot to
 * be filled (a pusher may be between its two steps). Slots are never reused
 * within a track, so there is no ABA. A ticket means "help run
 * system s": a system with n tasks has R = min(n, workers) holders -- R
 * tickets for a root of the track, R - 1 and the completing worker, which
 * keeps it inline, for a successor -- and its tasks are cut into R
 * contiguous ranges. A root callback system (one task, so one ticket) is
 * not made ready by the stepping thread: its ticket says so
 * (TICKET_PREPARE), and its one holder makes it ready, so that the
 * stepping thread does not prepare every root alone before the workers
 * start, and the system's state is written on the thread that runs it.
 *
 * Task ranges (core/ranges.c): a parallel system's tasks are cut into R
 * contiguous ranges, range w the home of worker w; a ticket holder claims
 * from the front of its home, then steals single tasks from the back of
 * the fullest range (a holder with no home, w >= R, only steals; so are
 * the tasks of a home whose worker holds no ticket). Ranges and not one
 * shared counter: a counter deals neighbouring tasks to different threads,
 * so both threads stream through the same stretch of memory; with ranges
 * each streams its own contiguous stretch (2 workers, 2 tasks each, a
 * 1M-row pass: ticks of 0.44-0.53 ms against 0.52-0.70 with the counter;
 * docs/performance.md). Homes by worker index, not by arrival: with homes
 * dealt first come first served, a tick whose two workers arrived in the
 * other order than the tick before ran each task in 0.53 ms instead of
 * 0.15-0.2 (its rows sat in the caches nearest the other CPU). Which thread ran a task never shows: a task's
 * commands go to its own buffer, applied in task order. A stale holder
 * (the system completed) finds every range empty; ranges are reset by
 * make_ready, before any ticket exists (or, for a prepared root, by its one
 * holder before it claims a task).
 * A system with one range (one task, or one worker's worth) has exactly
 * one holder -- one ticket, or the completing worker that keeps it inline
 * -- so that holder runs its tasks in order with no claim, no `started`
 * and no `tasks_done`: four locked instructions per system fewer.
 *
 * Completion: the worker that finishes a system's last task completes it:
 * it marks successors dep_failed when the system failed (before decrementing,
 * so the release-acquire on preds_left carries the flag), decrements each
 * successor's preds_left, and the decrement that reaches 0 readies the
 * successor. A ready successor with dep_failed is skipped on the spot and
 * completes in turn (so skips propagate transitively). Of the successors
 * that become runnable, the completing worker keeps one and runs it inline
 * (no hand-off for a lone ready system) and pushes tickets for the others.
 * remaining counts systems not yet completed; a worker subtracts its
 * completions once per claimed batch (not per system: it is the one line
 * every worker writes), and the decrement that reaches 0 wakes every idle
 * worker so the track can end.
 *
 * Idle workers spin briefly on the queue, then sleep on the work_seq futex
 * after registering in `sleepers`; pushers bump work_seq and wake when
 * sleepers > 0. (Dekker pattern on sleepers / the queue, all seq_cst.)
 * Between tracks and ticks workers spin for PARK_SPIN_NS (50 µs), then sleep
 * in the kernel on the epoch futex (registered in `parked`, the same Dekker
 * pattern against the epoch bump), so a 60 Hz server's workers sleep between
 * ticks while back-to-back tracks cost no system call.
 *
 * Worker placement: before each epoch bump the stepping thread notes its
 * CPU in stepper_cpu (a hint: relaxed, read after the epoch); a worker that
 * finds itself woken onto that CPU -- for a track or a job, or by a push
 * inside a track -- or moved there while it spun (the kernel's balancing),
 * seen at its next claim, moves off it (core_placement_avoid, core/thread.c
 * "Placement"), or the kernel may leave the two taking turns on one CPU
 * while another idles. The look costs a read of the CPU number (rseq).
 */
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/core.h"
#include "sched/sched_internal.h"

/* An idle worker inside a track spins SPIN_LIMIT pauses (0.3-0.4 ms on the
 * machines of docs/performance.md) before it sleeps: it usually waits for
 * the last task of a parallel system, and waking a sleeping vCPU costs tens
 * of microseconds that the track's end then waits for (2000 pauses cost the
 * 2-worker iterate tick 75-130 us; 20000, 28-37 us). */
#define SPIN_LIMIT 20000
/* Tasks per worker of a parallel query system: fewer, longer tasks stream
 * memory better (see "Task ranges"); more balance uneven chunks. */
#define TASKS_PER_WORKER 2
#define POP_BATCH 16
#define PARK_SPIN_NS 50000ull   /* a worker spins this long after a track before it sleeps */
#define TICKET_PREPARE 0x80000000u /* in a ticket: a root its holder makes ready (dispatch_parallel) */
#define BACKOFF_SPINS 1024      /* pauses (tens of microseconds) before the stepping thread yields */

static void futex_wait(_Atomic uint32_t *addr, uint32_t expected)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* ---- running one task ------------------------------------------------------ */

static int run_query_task(keel_ctx *ctx, const sched_system *sys, sched_run *st, uint32_t task)
{
    /* tasks split the chunk list evenly: task k owns [k*n/T, (k+1)*n/T) */
    uint32_t first = (uint32_t)((uint64_t)task * st->nchunks / st->ntasks);
    uint32_t last = (uint32_t)((uint64_t)(task + 1) * st->nchunks / st->ntasks);
    uint64_t rows = 0;
    int rc = 0;
    for (uint32_t c = first; !rc && !ctx->fail_rc && c < last; c++) {
        keel_iter it;
        rc = txn_iter_chunk(ctx, sys->query, sys->d.query.with, st->chunks[c], &it);
        if (rc)
            break;
        rows += it.count;
        rc = sys->d.each_chunk(ctx, &it, sys->d.user);
    }
    atomic_fetch_add_explicit(&st->rows, rows, memory_order_relaxed);
    return rc;
}

/* Run one task. *clock is a timestamp the task may use as its start, or 0 to
 * read the clock; it must not precede the system's readiness. Serial mode
 * passes the previous system's end, so a system costs one clock read, not
 * two (ex->clock, core/clock.c: ~11 ns from the TSC, where clock_gettime
 * costs ~27 ns on a VM; a fresh start is read fenced, so that it
 * follows the predecessor's end stamped on another core, whose completion
 * this thread has seen); parallel mode follows the
 * rule in work_loop. Either way a system's time includes the commit of the
 * one before it on that thread. `first`: this is the system's first task to
 * start, whose start and worker the telemetry records (with task ranges,
 * not necessarily task 0). On return *clock is the task's end. */
static void run_task(sched_exec *ex, uint32_t s, uint32_t task, uint32_t worker, uint64_t *clock, bool first)
{
    const sched_system *sys = &ex->sched->sys[s];
    sched_run *st = &ex->st[s];
    uint64_t t0 = *clock ? *clock : core_clock_ns_fenced(&ex->clock); /* after the claim: see run_task */
    if (first) { /* read after the last task by whoever completes it: see help */
        st->start_ns = t0;
        st->worker = worker;
    }
    /* publish (sys, tick) before since: see watchdog.c */
    atomic_store_explicit(&ex->watch[worker].sys, s, memory_order_release);
    atomic_store_explicit(&ex->watch[worker].tick, atomic_load_explicit(&ex->txn->running_tick, memory_order_relaxed),
                          memory_order_release);
    atomic_store_explicit(&ex->watch[worker].since_ns, t0, memory_order_release);

    keel_ctx ctx = {.rt = ex->rt, .txn = ex->txn, .sys = s, .task = task, .worker = worker, .name = sys->d.name};
    int rc;
    if (sys->d.kind == KEEL_SYSTEM_PIPELINE) {
        rc = sys->d.pipeline(task, sys->d.pipeline_count, sys->d.user);
    } else {
        ctx.cmds = st->cmds[task]; /* empty and reset since the last sync point */
        ctx.part = &st->parts[task];
        ctx.acc = &sys->acc;
        rc = sys->d.kind == KEEL_SYSTEM_CALLBACK ? sys->d.run(&ctx, sys->d.user) : run_query_task(&ctx, sys, st, task);
        txn_close_sides(ctx.part);
    }
    if (!rc)
        rc = ctx.fail_rc;
    if (rc) {
        int none = 0;
        atomic_compare_exchange_strong(&st->fail_rc, &none, rc);
    }
    atomic_store_explicit(&ex->watch[worker].since_ns, 0, memory_order_release);
    *clock = core_clock_ns(&ex->clock);
}

/* ---- readiness and completion ------------------------------------------------ */

/* Entity budget (overload SCOPE_REDUCTION, docs/overload.md): keep only the
 * rows [cursor, cursor + budget) of the query's iteration order, cutting the
 * chunks where that window starts and ends. The next tick resumes after the
 * window; a window that reaches the last row ends the pass, and the next
 * tick starts over at row 0. Below SCOPE_REDUCTION (and for CRITICAL
 * systems) every row is visited and the next reduction starts a fresh pass. */
static void budget_trim(sched_exec *ex, uint32_t s)
{
    const keel_system_desc *d = &ex->sched->sys[s].d;
    sched_run *st = &ex->st[s];
    if (!d->entity_budget || d->priority == KEEL_PRIORITY_CRITICAL ||
        ex->tick_level < KEEL_OVERLOAD_SCOPE_REDUCTION) {
        st->cursor = 0;
        return;
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < st->nchunks; i++)
        total += st->chunks[i].rows;
    if (st->cursor >= total)
        st->cursor = 0; /* rows were destroyed since the pass began */
    uint64_t skip = st->cursor, left = d->entity_budget;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < st->nchunks && left; i++) {
        world_chunk_ref r = st->chunks[i];
        if (skip >= r.rows) {
            skip -= r.rows;
            continue;
        }
        r.first = (uint32_t)skip;
        r.rows -= (uint32_t)skip;
        skip = 0;
        if (r.rows > left)
            r.rows = (uint32_t)left;
        left -= r.rows;
        st->chunks[kept++] = r;
    }
    uint64_t visited = d->entity_budget - left;
    st->nchunks = kept;
    st->deferred = total - visited;
    st->cursor = st->cursor + visited >= total ? 0 : st->cursor + visited;
}

/* Split a query system's chunks into tasks; called by the thread that makes
 * the system ready, before any ticket for it is published. */
static int plan_tasks(sched_exec *ex, uint32_t s)
{
    const sched_system *sys = &ex->sched->sys[s];
    sched_run *st = &ex->st[s];
    st->ntasks = 1;
    if (sys->d.kind == KEEL_SYSTEM_PIPELINE) {
        st->ntasks = sys->d.pipeline_count;
        return KEEL_OK;
    }
    if (sys->d.kind != KEEL_SYSTEM_QUERY)
        return KEEL_OK;
    uint32_t n = query_chunk_refs(sys->query, st->chunks, st->chunks_cap);
    if (n > st->chunks_cap) {
        world_chunk_ref *c = realloc(st->chunks, (size_t)n * 2 * sizeof *c);
        if (!c)
            return core_fail(KEEL_ENOMEM, "system '%s': out of memory planning its chunk tasks", sys->d.name);
        st->chunks = c;
        st->chunks_cap = n * 2;
        n = query_chunk_refs(sys->query, st->chunks, st->chunks_cap);
    }
    st->nchunks = n;
    budget_trim(ex, s);
    n = st->nchunks;
    if (!sys->d.parallel || ex->workers == 1 || n <= 1)
        return KEEL_OK;
    uint64_t rows = 0;
    for (uint32_t i = 0; i < n; i++)
        rows += st->chunks[i].rows;
    uint32_t min_rows = sys->d.min_chunk_rows ? sys->d.min_chunk_rows : 64;
    uint64_t by_rows = rows / min_rows ? rows / min_rows : 1;
    uint32_t t = ex->workers * TASKS_PER_WORKER;
    if (t > n)
        t = n;
    if (t > by_rows)
        t = (uint32_t)by_rows;
    st->ntasks = t;
    return KEEL_OK;
}

/* Make sure system s has a command buffer and a transaction part per task. */
static int ensure_cmdbufs(sched_exec *ex, uint32_t s)
{
    sched_run *st = &ex->st[s];
    if (ex->sched->sys[s].d.kind == KEEL_SYSTEM_PIPELINE || st->ncmds >= st->ntasks)
        return KEEL_OK;
    keel_cmdbuf **cmds = realloc(st->cmds, st->ntasks * sizeof *cmds);
    if (cmds)
        st->cmds = cmds;
    txn_part *parts = cmds ? realloc(st->parts, st->ntasks * sizeof *parts) : NULL;
    if (!parts)
        return core_fail(KEEL_ENOMEM, "out of memory for command buffers");
    st->parts = parts;
    for (; st->ncmds < st->ntasks; st->ncmds++) {
        st->parts[st->ncmds] = (txn_part){0};
        if (keel_cmdbuf_create(ex->world, &st->cmds[st->ncmds]))
            return KEEL_ENOMEM;
    }
    return KEEL_OK;
}

/* Cut system s's tasks into min(ntasks, workers) contiguous ranges, range w
 * worker w's home (see "Task ranges" above). */
static int cut_ranges(sched_exec *ex, uint32_t s)
{
    sched_run *st = &ex->st[s];
    if (ex->workers == 1)
        return KEEL_OK; /* serial mode runs tasks in index order, without tickets */
    if (!st->ranges) {
        st->ranges = calloc(ex->workers, sizeof *st->ranges);
        if (!st->ranges)
            return core_fail(KEEL_ENOMEM, "system '%s': out of memory for its task ranges", ex->sched->sys[s].d.name);
    }
    uint32_t r = st->ntasks < ex->workers ? st->ntasks : ex->workers;
    for (uint32_t i = 0; i < r; i++)
        core_range_set(&st->ranges[i], (uint32_t)((uint64_t)st->ntasks * i / r),
                       (uint32_t)((uint64_t)st->ntasks * (i + 1) / r));
    st->nranges = r;
    return KEEL_OK;
}

/* Overload throttling (docs/overload.md): from SYSTEM_THROTTLING on, LOW
 * systems are shed and NORMAL ones run on one tick in `divisor`, staggered
 * by registration index so that every tick carries a share of them rather
 * than all of them on one tick in `divisor` (which would overrun that tick
 * as much as before). */
static bool throttled(const sched_exec *ex, uint32_t s)
{
    if (ex->tick_level < KEEL_OVERLOAD_SYSTEM_THROTTLING)
        return false;
    keel_priority p = ex->sched->sys[s].d.priority;
    if (p != KEEL_PRIORITY_LOW && p != KEEL_PRIORITY_NORMAL)
        return false;
    uint64_t tick = atomic_load_explicit(&ex->txn->running_tick, memory_order_relaxed);
    return p == KEEL_PRIORITY_LOW || (tick + s) % ex->ovl_divisor != 0;
}

/* Prepare a system whose predecessors completed. Returns true when it has
 * tasks to run; false when it completes on the spot: skipped (a predecessor
 * failed, it is throttled, or its tasks could not be planned: skip is set)
 * or empty (a pipeline of 0 indices). */
static void reset_run(sched_run *st);

static bool make_ready(sched_exec *ex, uint32_t s)
{
    sched_run *st = &ex->st[s];
    reset_run(st);
    if (atomic_load_explicit(&st->dep_failed, memory_order_relaxed)) {
        st->skip = KEEL_SKIP_DEPENDENCY_FAILED;
        return false;
    }
    if (throttled(ex, s)) {
        st->skip = KEEL_SKIP_THROTTLED;
        return false;
    }
    int rc = plan_tasks(ex, s);
    if (!rc)
        rc = ensure_cmdbufs(ex, s);
    if (!rc)
        rc = cut_ranges(ex, s);
    if (rc) {
        core_log(KEEL_LOG_ERROR, "sched", "system_not_run", "system=%s rc=%s", ex->sched->sys[s].d.name,
                 keel_strerror(rc));
        atomic_store(&st->fail_rc, rc);
        st->skip = KEEL_SKIP_FAILED;
        st->ntasks = 0; /* failed without running a task */
        return false;
    }
    return st->ntasks > 0;
}

/* Per-run fields: reset by the thread that makes the system ready, before
 * any ticket for it exists. (Not at completion: a worker holding a stale
 * "help" ticket may still claim from the ranges after the system
 * completed: it finds them empty.) */
static void reset_run(sched_run *st)
{
    atomic_store_explicit(&st->started, false, memory_order_relaxed);
    st->nranges = 0;
    atomic_store_explicit(&st->tasks_done, 0, memory_order_relaxed);
    atomic_store_explicit(&st->fail_rc, 0, memory_order_relaxed);
    atomic_store_explicit(&st->rows, 0, memory_order_relaxed);
    st->ntasks = 0;
    st->worker = 0;
    st->start_ns = st->end_ns = 0;
    st->skip = KEEL_SKIP_NONE;
    st->deferred = 0;
}

/* Readiness fields: reset when the system completes (every system completes
 * every tick, run or skipped), ready for the next tick's predecessors. */
static void reset_readiness(sched_exec *ex, uint32_t s)
{
    atomic_store_explicit(&ex->st[s].preds_left, ex->sched->npred[s], memory_order_relaxed);
    atomic_store_explicit(&ex->st[s].dep_failed, 0, memory_order_relaxed);
}

void dispatch_reset_system(sched_exec *ex, uint32_t s)
{
    reset_run(&ex->st[s]);
    reset_readiness(ex, s);
}

/* The last step of a system's tick, on the worker that completed it: count
 * it in the worker's share of the tick's counters and re-arm its readiness
 * for the next tick. Its per-run fields stay as they are until the stepping
 * thread has copied them into the telemetry ring at tick end. */
static void finish_system(sched_exec *ex, uint32_t s, uint32_t worker)
{
    const sched_run *st = &ex->st[s];
    sched_scratch *w = &ex->scratch[worker];
    bool skipped = st->skip == KEEL_SKIP_DEPENDENCY_FAILED || st->skip == KEEL_SKIP_THROTTLED;
    bool txn = ex->sched->sys[s].d.kind != KEEL_SYSTEM_PIPELINE && !skipped;
    w->commits += txn && st->skip == KEEL_SKIP_NONE;
    w->aborts += txn && st->skip == KEEL_SKIP_FAILED;
    w->run += !skipped;
    w->failed += st->skip == KEEL_SKIP_FAILED;
    w->skipped += skipped;
    w->throttled += st->skip == KEEL_SKIP_THROTTLED;
    reset_readiness(ex, s);
}

/* The outcome of system s, whose tasks are all done (or which was skipped):
 * a successful system's transaction commits; a failed one is rolled back --
 * its VERSIONED writes and its commands vanish -- and its end time is
 * recorded. A commit that cannot get memory fails the system the same way.
 * Returns true when its successors must be skipped: a throttled system did
 * not fail (it ran nothing), so its successors run. */
static bool settle(sched_exec *ex, uint32_t s, uint64_t now)
{
    sched_run *st = &ex->st[s];
    bool shed = st->skip == KEEL_SKIP_THROTTLED;
    bool failed = (st->skip != KEEL_SKIP_NONE && !shed) || atomic_load(&st->fail_rc) != 0;
    if (!failed && st->ntasks && st->ncmds) {
        int rc = txn_commit(ex->world, st->parts, st->ncmds, &st->changes);
        if (rc) {
            core_log(KEEL_LOG_ERROR, "txn", "commit_failed", "system=%s rc=%s", ex->sched->sys[s].d.name,
                     keel_strerror(rc));
            atomic_store(&st->fail_rc, rc);
            failed = true;
        }
    }
    if (st->skip == KEEL_SKIP_NONE && failed) {
        st->skip = KEEL_SKIP_FAILED;
        txn_abort(ex->world, st->parts, st->ncmds, &st->changes);
        for (uint32_t k = 0; k < st->ncmds; k++)
            keel_cmdbuf_discard(st->cmds[k]);
    }
    st->end_ns = st->skip == KEEL_SKIP_DEPENDENCY_FAILED || shed ? 0 : now;
    if (!st->start_ns && st->skip == KEEL_SKIP_NONE)
        st->start_ns = st->end_ns; /* nothing to run (a pipeline of 0 indices) */
    return failed;
}

typedef struct ready_list {
    uint32_t *items;
    uint32_t n;
} ready_list;

/* Complete system s and every system its outcome skips; runnable successors
 * are appended to out. Returns the number of systems completed. */
static uint32_t complete(sched_exec *ex, uint32_t s, uint64_t now, uint32_t worker, ready_list *out,
                         uint32_t *stack)
{
    const keel_schedule *sc = ex->sched;
    uint32_t top = 0, completed = 0;
    stack[top++] = s;
    while (top) {
        uint32_t u = stack[--top];
        bool failed = settle(ex, u, now);
        completed++;
        for (uint32_t k = sc->succ_off[u]; k < sc->succ_off[u + 1]; k++) {
            uint32_t v = sc->succ[k];
            if (failed)
                atomic_store_explicit(&ex->st[v].dep_failed, 1, memory_order_relaxed);
            if (atomic_fetch_sub_explicit(&ex->st[v].preds_left, 1, memory_order_acq_rel) != 1)
                continue;
            if (make_ready(ex, v))
                out->items[out->n++] = v;
            else
                stack[top++] = v;
        }
        finish_system(ex, u, worker);
    }
    return completed;
}

/* ---- serial mode -------------------------------------------------------------- */

static void dispatch_serial(sched_exec *ex, const sched_track *t)
{
    const keel_schedule *sc = ex->sched;
    uint64_t clock = core_clock_ns(&ex->clock);
    for (uint32_t i = t->first; i < t->first + t->count; i++) {
        uint32_t s = sc->order[i];
        sched_run *st = &ex->st[s];
        if (make_ready(ex, s))
            for (uint32_t k = 0; k < st->ntasks; k++)
                run_task(ex, s, k, 0, &clock, k == 0);
        if (settle(ex, s, clock))
            for (uint32_t k = sc->succ_off[s]; k < sc->succ_off[s + 1]; k++)
                atomic_store_explicit(&ex->st[sc->succ[k]].dep_failed, 1, memory_order_relaxed);
        finish_system(ex, s, 0);
    }
}

/* ---- parallel mode ------------------------------------------------------------ */

static void push_ticket(sched_pool *p, uint32_t s)
{
    uint32_t slot = atomic_fetch_add(&p->tail, 1);
    atomic_store_explicit(&p->tickets[slot], s + 1, memory_order_release);
}

static void wake_idle(sched_pool *p)
{
    atomic_fetch_add(&p->work_seq, 1);
    if (atomic_load(&p->sleepers))
        futex_wake_all(&p->work_seq);
}

/* Claim a share of the queued tickets with one CAS: available / workers of
 * them (at least 1, at most POP_BATCH), so that a wide fan-out of small
 * systems is not one contended CAS per system. Returns how many were claimed
 * into out (0 when the queue is empty). */
static uint32_t pop_tickets(sched_pool *p, uint32_t workers, uint32_t *out)
{
    for (;;) {
        uint32_t h = atomic_load(&p->head), t = atomic_load(&p->tail);
        if (h >= t)
            return 0;
        uint32_t k = (t - h) / workers;
        k = k < 1 ? 1 : k > POP_BATCH ? POP_BATCH : k;
        if (!atomic_compare_exchange_weak(&p->head, &h, h + k))
            continue;
        for (uint32_t i = 0; i < k; i++) {
            uint32_t v;
            while (!(v = atomic_load_explicit(&p->tickets[h + i], memory_order_acquire)))
                core_cpu_relax(); /* the pusher holds the slot but has not filled it yet */
            out[i] = v - 1;
        }
        return k;
    }
}

/* Tickets for the systems in `ready`, keeping one to run inline. */
static uint32_t publish(sched_exec *ex, ready_list *ready)
{
    sched_pool *p = &ex->pool;
    if (!ready->n)
        return SCHED_NONE;
    uint32_t keep = ready->items[0];
    bool pushed = false;
    for (uint32_t i = 0; i < ready->n; i++) {
        uint32_t s = ready->items[i], ntasks = ex->st[s].ntasks;
        uint32_t tickets = ntasks < ex->workers ? ntasks : ex->workers;
        if (s == keep && tickets)
            tickets--; /* this thread helps too */
        for (uint32_t k = 0; k < tickets; k++)
            push_ticket(p, s);
        pushed |= tickets > 0;
    }
    ready->n = 0;
    if (pushed)
        wake_idle(p);
    return keep;
}

/* Help system s: claim and run its tasks until none is left. Returns the
 * system to run next inline, or SCHED_NONE, and adds the systems this thread
 * completed to *done (work_loop subtracts them from `remaining` once per
 * claimed batch). *clock: see run_task; s must have been ready before the
 * reading it holds. */
static uint32_t help(sched_exec *ex, uint32_t s, uint32_t worker, ready_list *ready, uint32_t *stack,
                     uint64_t *clock, uint32_t *done)
{
    sched_run *st = &ex->st[s];
    if (st->nranges == 1) { /* its one holder: nobody to claim against or count with ("Task ranges") */
        for (uint32_t k = 0; k < st->ntasks; k++)
            run_task(ex, s, k, worker, clock, k == 0);
        *done += complete(ex, s, *clock, worker, ready, stack);
        return publish(ex, ready);
    }
    uint32_t home = UINT32_MAX;
    for (;;) {
        uint32_t k = core_range_claim(st->ranges, st->nranges, &home, worker);
        if (k == UINT32_MAX)
            return SCHED_NONE;
        /* the first claim takes the telemetry start; its writes reach the
         * completer through the tasks_done chain below */
        run_task(ex, s, k, worker, clock, !atomic_exchange_explicit(&st->started, true, memory_order_relaxed));
        if (atomic_fetch_add(&st->tasks_done, 1) + 1 == st->ntasks) {
            *done += complete(ex, s, *clock, worker, ready, stack);
            return publish(ex, ready);
        }
    }
}

/* A claimed ticket's system, ready to help: a root the stepping thread left
 * for its holder to make ready (TICKET_PREPARE) is made ready here; one
 * that completes on the spot (skipped) is completed, and the system to run
 * next is then one of the successors that made ready, or none. */
static uint32_t holder_ready(sched_exec *ex, uint32_t ticket, uint32_t worker, ready_list *ready, uint32_t *stack,
                             uint32_t *done)
{
    uint32_t s = ticket & ~TICKET_PREPARE;
    if (s == ticket || make_ready(ex, s))
        return s;
    *done += complete(ex, s, core_clock_ns(&ex->clock), worker, ready, stack);
    return publish(ex, ready);
}

/* Record the stepping thread's CPU for the workers the next epoch bump
 * wakes (see "Worker placement"). */
static void note_stepper_cpu(sched_pool *p)
{
    atomic_store_explicit(&p->stepper_cpu, core_cpu_now(), memory_order_relaxed);
}

/* A worker just woken: off the stepping thread's CPU if it is on it. */
static void leave_stepper_cpu(sched_pool *p, core_placement *place)
{
    core_placement_avoid(place, atomic_load_explicit(&p->stepper_cpu, memory_order_relaxed));
}

static void work_loop(sched_exec *ex, uint32_t worker, sched_scratch *w, core_placement *place)
{
    sched_pool *p = &ex->pool;
    ready_list ready = {w->ready, 0};
    uint32_t spins = 0;
    uint64_t clock = 0;
    uint32_t claimed[POP_BATCH];
    while (atomic_load(&p->remaining) > 0) {
        uint32_t n = pop_tickets(p, ex->workers, claimed);
        if (n) {
            if (place && spins) /* it waited: the kernel may have moved it meanwhile */
                leave_stepper_cpu(p, place);
            /* Every claimed ticket was ready before the claim, so any clock
             * reading taken since can serve as the start of its system: one
             * reading per system, as in serial mode. A successor kept
             * inline became ready after the last reading and reads afresh.
             * Completions leave `remaining` once per batch, not once per
             * system: it is the one line every worker writes, and the only
             * decrement anyone acts on -- the one reaching 0 -- still
             * comes, later by at most this batch, which keeps this thread
             * busy meanwhile. */
            uint32_t done = 0;
            clock = 0;
            for (uint32_t i = 0; i < n; i++)
                for (uint32_t s = holder_ready(ex, claimed[i], worker, &ready, w->stack, &done); s != SCHED_NONE;)
                    if ((s = help(ex, s, worker, &ready, w->stack, &clock, &done)) != SCHED_NONE)
                        clock = 0;
            if (done && atomic_fetch_sub(&p->remaining, done) == done)
                wake_idle(p);
            spins = 0;
            continue;
        }
        if (++spins < SPIN_LIMIT) {
            core_cpu_relax();
            continue;
        }
        uint32_t seq = atomic_load(&p->work_seq);
        atomic_fetch_add(&p->sleepers, 1);
        if (atomic_load(&p->head) >= atomic_load(&p->tail) && atomic_load(&p->remaining) > 0)
            futex_wait(&p->work_seq, seq);
        atomic_fetch_sub(&p->sleepers, 1);
        if (place) /* woken by a push, maybe onto the stepping thread's CPU */
            leave_stepper_cpu(p, place);
        spins = 0;
    }
}

/* Wait for the epoch to move past `seen`: spin for PARK_SPIN_NS first (back
 * to back tracks and unthrottled ticks then cost no system call), then
 * sleep in the kernel. Parking registers in `parked` before the last check
 * of the epoch, and the caller bumps the epoch before reading `parked`
 * (both seq_cst): either the worker sees the new epoch or the caller sees it
 * parked and wakes it. Returns the epoch seen (== seen after a wake-up, so
 * the caller loops). */
static uint32_t wait_epoch(sched_pool *p, uint32_t seen)
{
    uint64_t start = 0;
    for (uint32_t i = 0;; i++) {
        uint32_t e = atomic_load(&p->epoch);
        if (e != seen)
            return e;
        if ((i & 63) == 63) {
            uint64_t now = core_now_ns();
            if (!start)
                start = now;
            else if (now - start > PARK_SPIN_NS)
                break;
        }
        core_cpu_relax();
    }
    atomic_fetch_add(&p->parked, 1);
    if (atomic_load(&p->epoch) == seen)
        futex_wait(&p->epoch, seen);
    atomic_fetch_sub(&p->parked, 1);
    return seen;
}

typedef struct worker_arg {
    sched_exec *ex;
    uint32_t index;
} worker_arg;

/* ---- parallel-for (the capture, the fence's serialize stage) -----------------------
 * dispatch_for runs fn(arg, i, worker) for i in [0, n) on the pool, reusing
 * the track hand-shake (track_live / active / epoch) with p->job set instead
 * of a track: every participant claims indices with fetch_add(next) and
 * counts them in done; the caller returns when done == n.
 * dispatch_post starts the same and returns (the fence between ticks): the
 * participant whose done count reaches n calls finish and then sets
 * `finished` (release). dispatch_join, on the stepping thread, claims what
 * is left, waits for `finished` (acquire: finish's writes are then visible),
 * and takes the job down as dispatch_for does (track_live off, no worker
 * active, p->job NULL). Between post and join the stepping thread starts no
 * track and no other job, so p->job and track_live stay the posted job's. */

/* One round of the stepping thread's wait for the workers, *i the rounds
 * so far: a pause for the first BACKOFF_SPINS (what it waits for usually
 * comes within microseconds, and a sched_yield is a system call, a
 * microsecond or more on a VM), then a yield each time (a worker that has
 * no CPU of its own then gets this one). */
static void backoff(uint32_t *i)
{
    if (*i < BACKOFF_SPINS) {
        ++*i;
        core_cpu_relax();
    } else {
        sched_yield();
    }
}

static void job_loop(sched_job *j, uint32_t worker)
{
    for (uint32_t i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) {
        j->fn(j->arg, i, worker);
        if (atomic_fetch_add(&j->done, 1) + 1 == j->n && j->finish) {
            j->finish(j->arg);
            atomic_store_explicit(&j->finished, true, memory_order_release);
        }
    }
}

/* The track hand-shake's start with p->job = j: the workers run job_loop. */
static void job_start(sched_pool *p, sched_job *j)
{
    note_stepper_cpu(p);
    atomic_store(&p->job, j);
    atomic_store(&p->track_live, true);
    atomic_fetch_add(&p->epoch, 1);
    if (atomic_load(&p->parked))
        futex_wake_all(&p->epoch);
}

/* ... and its end, once the job's indices are done. */
static void job_end(sched_pool *p)
{
    atomic_store(&p->track_live, false);
    for (uint32_t i = 0; atomic_load(&p->active);)
        backoff(&i);
    atomic_store(&p->job, NULL);
}

void dispatch_for(sched_exec *ex, uint32_t n, core_task_fn fn, void *arg)
{
    sched_job j = {.fn = fn, .arg = arg, .n = n};
    sched_pool *p = &ex->pool;
    if (ex->workers == 1 || n < 2) {
        job_loop(&j, 0);
        return;
    }
    job_start(p, &j);
    job_loop(&j, 0);
    for (uint32_t i = 0; atomic_load(&j.done) < n;)
        backoff(&i);
    job_end(p);
}

void dispatch_post(sched_exec *ex, uint32_t n, core_task_fn fn, void (*finish)(void *), void *arg)
{
    sched_job *j = &ex->posted;
    j->fn = fn;
    j->finish = finish;
    j->arg = arg;
    j->n = n;
    atomic_store(&j->next, 0);
    atomic_store(&j->done, 0);
    atomic_store(&j->finished, false);
    ex->is_posted = true;
    if (ex->workers == 1 || n == 0) { /* no one else to run it */
        job_loop(j, 0);
        if (!n) {
            finish(arg);
            atomic_store(&j->finished, true);
        }
        return;
    }
    job_start(&ex->pool, j);
}

void dispatch_join(sched_exec *ex)
{
    if (!ex->is_posted)
        return;
    ex->is_posted = false;
    sched_job *j = &ex->posted;
    if (ex->workers == 1 || j->n == 0)
        return; /* ran in dispatch_post */
    job_loop(j, 0);
    for (uint32_t i = 0; !atomic_load_explicit(&j->finished, memory_order_acquire);)
        backoff(&i);
    job_end(&ex->pool);
}

static void pool_run(void *self, uint32_t n, core_task_fn fn, void *arg)
{
    dispatch_for(self, n, fn, arg);
}

static void pool_post(void *self, uint32_t n, core_task_fn fn, void (*finish)(void *), void *arg)
{
    dispatch_post(self, n, fn, finish, arg);
}

static void pool_join(void *self)
{
    dispatch_join(self);
}

core_pool dispatch_pool(sched_exec *ex)
{
    return (core_pool){pool_run, pool_post, pool_join, ex, ex->workers};
}

static void *worker_main(void *arg)
{
    worker_arg a = *(worker_arg *)arg;
    free(arg);
    sched_exec *ex = a.ex;
    sched_pool *p = &ex->pool;
    core_placement place;
    core_placement_init(&place);
    uint32_t seen = 0;
    for (;;) {
        uint32_t e = wait_epoch(p, seen);
        if (e == seen)
            continue;
        seen = e;
        if (atomic_load(&p->quit))
            break;
        leave_stepper_cpu(p, &place);
        atomic_fetch_add(&p->active, 1);
        if (atomic_load(&p->track_live) && atomic_load(&p->epoch) == seen) {
            sched_job *job = atomic_load(&p->job);
            if (job)
                job_loop(job, a.index);
            else
                work_loop(ex, a.index, &ex->scratch[a.index], &place);
        }
        atomic_fetch_sub(&p->active, 1);
    }
    return NULL;
}

static void dispatch_parallel(sched_exec *ex, const sched_track *t)
{
    const keel_schedule *sc = ex->sched;
    sched_pool *p = &ex->pool;
    sched_scratch *w = &ex->scratch[0];
    /* prepare: no worker touches track state now (track_live == 0, active == 0) */
    atomic_store(&p->head, 0);
    atomic_store(&p->tail, 0);
    memset((void *)p->tickets, 0, p->tickets_cap * sizeof *p->tickets);
    ready_list ready = {w->ready, 0};
    uint32_t done = 0;
    /* every root gets its tickets (no worker takes one before the epoch moves); the caller keeps
       none: it joins below. A callback has one task, so one ticket: its holder makes it ready */
    for (uint32_t i = t->roots_first; i < t->roots_first + t->roots_count; i++) {
        uint32_t s = sc->roots[i];
        if (sc->sys[s].d.kind == KEEL_SYSTEM_CALLBACK)
            push_ticket(p, s | TICKET_PREPARE);
        else if (make_ready(ex, s))
            ready.items[ready.n++] = s;
        else
            done += complete(ex, s, core_clock_ns(&ex->clock), 0, &ready, w->stack);
    }
    if (done == t->count)
        return;
    atomic_store(&p->remaining, t->count - done);
    for (uint32_t i = 0; i < ready.n; i++) {
        uint32_t s = ready.items[i], n = ex->st[s].ntasks < ex->workers ? ex->st[s].ntasks : ex->workers;
        for (uint32_t k = 0; k < n; k++)
            push_ticket(p, s);
    }
    note_stepper_cpu(p);
    atomic_store(&p->track_live, true);
    atomic_fetch_add(&p->epoch, 1);
    if (atomic_load(&p->parked))
        futex_wake_all(&p->epoch);
    work_loop(ex, 0, w, NULL);
    atomic_store(&p->track_live, false);
    for (uint32_t i = 0; atomic_load(&p->active);)
        backoff(&i);
}

uint64_t dispatch_anchor(sched_exec *ex)
{
    return core_clock_anchor(&ex->clock);
}

/* Systems' tick state was reset by their completers in the last tick (or at
 * install), so starting a track touches none of it. */
void dispatch_track(sched_exec *ex, const sched_track *t)
{
    if (!t->count)
        return;
    if (ex->workers == 1)
        dispatch_serial(ex, t);
    else
        dispatch_parallel(ex, t);
}

/* ---- pool lifetime ------------------------------------------------------------ */

int dispatch_init(sched_exec *ex)
{
    sched_pool *p = &ex->pool;
    p->nthreads = ex->workers - 1;
    if (!p->nthreads)
        return KEEL_OK;
    p->threads = calloc(p->nthreads, sizeof *p->threads);
    if (!p->threads)
        return core_fail(KEEL_ENOMEM, "keel_runtime_create: out of memory for %u workers", ex->workers);
    for (uint32_t i = 0; i < p->nthreads; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (a)
            *a = (worker_arg){ex, i + 1};
        if (!a || pthread_create(&p->threads[i], NULL, worker_main, a)) {
            free(a);
            p->nthreads = i;
            return core_fail(KEEL_ENOMEM, "keel_runtime_create: cannot start worker thread %u", i + 1);
        }
        core_thread_name(p->threads[i], "keel-worker-%u", i + 1);
    }
    return KEEL_OK;
}

void dispatch_fini(sched_exec *ex)
{
    sched_pool *p = &ex->pool;
    atomic_store(&p->quit, true);
    atomic_fetch_add(&p->epoch, 1);
    futex_wake_all(&p->epoch);
    for (uint32_t i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    free((void *)p->tickets);
    for (uint32_t i = 0; ex->scratch && i < ex->workers; i++) {
        free(ex->scratch[i].ready);
        free(ex->scratch[i].stack);
    }
    free(ex->scratch);
}

int dispatch_prepare(sched_exec *ex)
{
    uint32_t nsys = ex->sched->nsys + 1;
    sched_pool *p = &ex->pool;
    free((void *)p->tickets);
    p->tickets_cap = nsys * ex->workers;
    p->tickets = calloc(p->tickets_cap, sizeof *p->tickets);
    if (!ex->scratch) {
        ex->scratch = aligned_alloc(64, ex->workers * sizeof *ex->scratch);
        if (ex->scratch)
            memset(ex->scratch, 0, ex->workers * sizeof *ex->scratch);
    }
    if (!p->tickets || !ex->scratch)
        return core_fail(KEEL_ENOMEM, "out of memory preparing the dispatcher");
    for (uint32_t i = 0; i < ex->workers; i++) {
        free(ex->scratch[i].ready);
        free(ex->scratch[i].stack);
        ex->scratch[i].ready = malloc(nsys * sizeof(uint32_t));
        ex->scratch[i].stack = malloc(nsys * sizeof(uint32_t));
        if (!ex->scratch[i].ready || !ex->scratch[i].stack)
            return core_fail(KEEL_ENOMEM, "out of memory preparing the dispatcher");
    }
    return KEEL_OK;
}
