/*
 * core/clock.c -- the anchored clock: CLOCK_MONOTONIC nanoseconds
 * extrapolated with the CPU's time-stamp counter from the last reading of
 * the real clock.
 *
 * Why: the scheduler stamps every system's start and end (telemetry, the
 * watchdog); clock_gettime costs ~27 ns on a 2-vCPU VM against ~11 ns
 * for rdtsc, and an empty system's budget is 60 ns.
 *
 * Protocol: one thread owns a core_clock and anchors it (core_clock_anchor)
 * at moments when no other thread reads it -- the tick thread, before it
 * hands the tick's systems to the workers; the hand-off (the pool's
 * seq_cst epoch and tickets) orders the anchor before every read, and the
 * track's completion orders every read before the next anchor. A reading
 * is the anchor's nanoseconds plus the TSC ticks since, scaled by a rate.
 * The first rate is measured between two anchors RATE_FIRST_NS apart and
 * used once the next anchor confirms it: within PAIR_TIGHT ticks over
 * RATE_FIRST_NS (2e-4 at 2.5 GHz, 2 us over a tick of ten milliseconds),
 * so a runtime reads the TSC after its first few ticks, not its first
 * tenth of a second (a system's stamp is its largest fixed cost). From a
 * span of RATE_SPAN_NS on, the rate is measured again at every anchor over
 * the growing span (restarted every RATE_RESTART_NS, so it follows NTP's
 * slewing of CLOCK_MONOTONIC; the rate before a restart serves until the
 * new span reaches RATE_SPAN_NS); an anchor the rate mispredicts (a
 * suspend, a step) starts the measurement over. A stamp that must follow
 * another core's (core_clock_ns_fenced) reads the TSC after an lfence. A
 * reading is clock_gettime instead until a rate is confirmed, after an
 * anchor whose pair of readings was split (preempted between them), and
 * where the TSC is not invariant (one rate on every core, through sleep
 * states).
 */
#include "core/core.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>

#define RATE_FIRST_NS 2000000ull        /* the span the first rate is measured over */
#define RATE_SPAN_NS 100000000ull       /* the shortest span a rate is measured again over */
#define RATE_RESTART_NS 2000000000ull   /* a span this long restarts the measurement */
#define PAIR_TRIES 3
#define PAIR_TIGHT 1000u                /* TSC ticks around one clock read: it was not preempted */
#define DRIFT_MAX_NS 20000ull           /* an anchor this far from the rate's prediction: measure again */

static bool tsc_invariant(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(0x80000007, &a, &b, &c, &d) && (d >> 8 & 1);
}

/* The real clock and the TSC at one instant, from the tightest of a few
 * tries; *tight: whether it is within PAIR_TIGHT (a pair split by
 * preemption would shift every reading extrapolated from it). */
static uint64_t clock_pair(uint64_t *tsc, bool *tight)
{
    uint64_t best = UINT64_MAX, ns = 0;
    for (int i = 0; i < PAIR_TRIES && best > PAIR_TIGHT; i++) {
        uint64_t a = __rdtsc(), n = core_now_ns(), b = __rdtsc();
        if (b >= a && b - a < best) {
            best = b - a;
            ns = n;
            *tsc = a + (b - a) / 2;
        }
    }
    *tight = best <= PAIR_TIGHT;
    return ns ? ns : core_now_ns();
}

/* Whether the last anchor and the rate predict this one within
 * DRIFT_MAX_NS plus 0.1 % of the time since (the rate's own error is five
 * times smaller for a first rate, thousands of times once re-measured). */
static bool predicted(const core_clock *c, uint64_t ns, uint64_t tsc)
{
    if (!c->ns || ns < c->ns || tsc < c->tsc)
        return false;
    uint64_t want = c->ns + core_clock_scale(tsc - c->tsc, c->rate);
    uint64_t off = want > ns ? want - ns : ns - want;
    return off <= DRIFT_MAX_NS + (ns - c->ns) / 1000;
}

uint64_t core_clock_anchor(core_clock *c)
{
    if (!c->checked) {
        c->checked = true;
        c->usable = tsc_invariant();
    }
    if (!c->usable)
        return core_now_ns();
    bool tight;
    uint64_t tsc = 0, ns = clock_pair(&tsc, &tight);
    c->mult = 0; /* until this anchor proves clean: readings are the real clock's */
    if (!tight)
        return ns;
    if (c->rate && !predicted(c, ns, tsc)) { /* a suspend, a step, a new slew: the rate is stale */
        c->rate = 0;
        c->ref_ns = 0;
    }
    bool first = !c->rate; /* a first rate is used once the next anchor confirms it (predicted) */
    if (!c->ref_ns || ns < c->ref_ns || tsc <= c->ref_tsc) {
        c->ref_ns = ns;
        c->ref_tsc = tsc;
    } else if (ns - c->ref_ns >= (first ? RATE_FIRST_NS : RATE_SPAN_NS)) {
        c->rate = (uint64_t)(((unsigned __int128)(ns - c->ref_ns) << 32) / (tsc - c->ref_tsc));
        if (ns - c->ref_ns >= RATE_RESTART_NS) {
            c->ref_ns = ns;
            c->ref_tsc = tsc;
        }
    }
    c->ns = ns;
    c->tsc = tsc;
    c->mult = first ? 0 : c->rate;
    return ns;
}

#else

uint64_t core_clock_anchor(core_clock *c)
{
    (void)c;
    return core_now_ns();
}

#endif
