/*
 * runtime/overload.h -- the overload detector as a pure state machine.
 *
 * ovl_feed takes one tick's measured duration and its budget and moves the
 * level (and, inside TICK_RATE_MODULATION, the tick multiplier) at most one
 * step. It reads no clock and calls nothing, so tests drive it with
 * synthetic sequences; the runtime (driver.c) feeds it once per metronome
 * tick and acts on what it returns. Rules: docs/overload.md.
 */
#ifndef KEEL_OVERLOAD_H
#define KEEL_OVERLOAD_H

#include <stdint.h>

#include "keel/runtime.h"

#define OVL_DEFAULT_THRESHOLD 1.2
#define OVL_DEFAULT_RATIO 0.6
#define OVL_DEFAULT_ESCALATION 5u
#define OVL_DEFAULT_DEESCALATION 20u
#define OVL_DEFAULT_DIVISOR 2u
#define OVL_DEFAULT_MIN_HZ 10.0
#define OVL_NMULTS 5u             /* the multiplier walks 1, 2, 3, 4, 6 */

typedef struct ovl_config {
    double overrun_threshold;     /* overrun: actual > threshold x budget */
    double calm_ratio;            /* calm: actual <= ratio x budget */
    uint32_t escalation_ticks;    /* >= 1 */
    uint32_t deescalation_ticks;  /* >= 1 */
    uint32_t mult_cap;            /* index of the largest usable multiplier, 0..OVL_NMULTS-1 */
} ovl_config;

typedef struct ovl_state {
    ovl_config cfg;
    keel_overload_level level;
    uint32_t mult;                /* index into the multipliers; 0 (1x) outside TICK_RATE_MODULATION
                                     and PLAYER_SHEDDING */
    uint32_t overruns;            /* current streak of consecutive overruns */
    uint32_t calm;                /* current streak of consecutive calm ticks */
} ovl_state;

typedef enum ovl_change {
    OVL_STAY = 0,
    OVL_LEVEL_UP,                 /* level + 1 (entering TICK_RATE_MODULATION sets 2x) */
    OVL_LEVEL_DOWN,               /* level - 1 */
    OVL_MULT_UP,                  /* inside TICK_RATE_MODULATION: the next multiplier */
    OVL_MULT_DOWN,                /* inside TICK_RATE_MODULATION: the previous multiplier */
} ovl_change;

/* Validate desc's detector fields and resolve the defaults against the base
 * tick rate (base_hz <= 0: unthrottled, no multiplier above 1). Returns 0
 * or KEEL_EINVAL with the last error naming the field. */
int ovl_config_resolve(const keel_overload_desc *desc, double base_hz, ovl_config *out);
/* The index of the largest of 1, 2, 3, 4, 6 that is <= base_hz / min_hz
 * (0 when none above 1 fits, or base_hz <= 0). */
uint32_t ovl_mult_cap(double base_hz, double min_hz);

void ovl_init(ovl_state *s, const ovl_config *cfg);
/* One tick: `actual_ns` measured against `budget_ns` (0: no budget, nothing
 * moves and both streaks reset). */
ovl_change ovl_feed(ovl_state *s, uint64_t actual_ns, uint64_t budget_ns);
/* The current tick multiplier: 1, 2, 3, 4 or 6. */
uint32_t ovl_multiplier(const ovl_state *s);

#endif
