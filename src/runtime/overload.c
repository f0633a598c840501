/*
 * runtime/overload.c -- the overload detector's state machine.
 *
 * Each tick is classified against its budget b: an overrun when it took
 * more than threshold x b, calm when it took at most ratio x b, neither in
 * between. A tick in the band between breaks both streaks: the load fits
 * this level's budget but without the headroom that makes a step down safe,
 * so "consecutive" means consecutive -- a band tick says the current level
 * is right. escalation_ticks consecutive overruns take one step up,
 * deescalation_ticks consecutive calm ticks one step down; every step starts
 * both streaks afresh.
 *
 * Steps up: NORMAL -> SYSTEM_THROTTLING -> SCOPE_REDUCTION ->
 * TICK_RATE_MODULATION (entered at 2x, or 1x when the floor allows no more)
 * -> the multiplier 2 -> 3 -> 4 -> 6 up to the cap -> PLAYER_SHEDDING
 * (the multiplier stays at the cap). Steps down walk the same path back:
 * PLAYER_SHEDDING -> TICK_RATE_MODULATION at the same multiplier -> the
 * multiplier down to 1 -> SCOPE_REDUCTION -> ... -> NORMAL.
 */

#include "core/core.h"
#include "runtime/overload.h"

static const uint32_t ovl_mults[OVL_NMULTS] = {1, 2, 3, 4, 6};

uint32_t ovl_mult_cap(double base_hz, double min_hz)
{
    if (!(base_hz > 0) || !(min_hz > 0))
        return 0;
    double room = base_hz / min_hz * (1 + 1e-9); /* 60 / 10 is 6 even after rounding */
    uint32_t cap = 0;
    while (cap + 1 < OVL_NMULTS && ovl_mults[cap + 1] <= room)
        cap++;
    return cap;
}

int ovl_config_resolve(const keel_overload_desc *d, double base_hz, ovl_config *out)
{
    double thr = d->overrun_threshold ? d->overrun_threshold : OVL_DEFAULT_THRESHOLD;
    double ratio = d->deescalation_ratio ? d->deescalation_ratio : OVL_DEFAULT_RATIO;
    double min_hz = d->min_tick_rate_hz ? d->min_tick_rate_hz : OVL_DEFAULT_MIN_HZ;
    if (!(thr > 0 && thr <= 1e6))
        return core_fail(KEEL_EINVAL, "keel_runtime_create: overload.overrun_threshold must be in (0, 1e6]");
    if (!(ratio > 0 && ratio < thr))
        return core_fail(KEEL_EINVAL, "keel_runtime_create: overload.deescalation_ratio must be in (0, "
                                      "overrun_threshold) = (0, %g)", thr);
    if (!(min_hz > 0 && min_hz <= 100000))
        return core_fail(KEEL_EINVAL, "keel_runtime_create: overload.min_tick_rate_hz must be in (0, 100000]");
    *out = (ovl_config){
        .overrun_threshold = thr,
        .calm_ratio = ratio,
        .escalation_ticks = d->escalation_ticks ? d->escalation_ticks : OVL_DEFAULT_ESCALATION,
        .deescalation_ticks = d->deescalation_ticks ? d->deescalation_ticks : OVL_DEFAULT_DEESCALATION,
        .mult_cap = ovl_mult_cap(base_hz, min_hz),
    };
    return KEEL_OK;
}

void ovl_init(ovl_state *s, const ovl_config *cfg)
{
    *s = (ovl_state){.cfg = *cfg, .level = KEEL_OVERLOAD_NORMAL};
}

uint32_t ovl_multiplier(const ovl_state *s)
{
    return ovl_mults[s->mult];
}

static ovl_change step_up(ovl_state *s)
{
    switch (s->level) {
    case KEEL_OVERLOAD_PLAYER_SHEDDING:
        return OVL_STAY; /* the last resort: nothing above it */
    case KEEL_OVERLOAD_TICK_RATE_MODULATION:
        if (s->mult < s->cfg.mult_cap) {
            s->mult++;
            return OVL_MULT_UP;
        }
        s->level = KEEL_OVERLOAD_PLAYER_SHEDDING;
        return OVL_LEVEL_UP;
    case KEEL_OVERLOAD_SCOPE_REDUCTION:
        s->level = KEEL_OVERLOAD_TICK_RATE_MODULATION;
        s->mult = s->cfg.mult_cap < 1 ? s->cfg.mult_cap : 1; /* enter at 2x when the floor allows */
        return OVL_LEVEL_UP;
    default:
        s->level++;
        return OVL_LEVEL_UP;
    }
}

static ovl_change step_down(ovl_state *s)
{
    switch (s->level) {
    case KEEL_OVERLOAD_NORMAL:
        return OVL_STAY;
    case KEEL_OVERLOAD_TICK_RATE_MODULATION:
        if (s->mult > 0) {
            s->mult--;
            return OVL_MULT_DOWN;
        }
        s->level = KEEL_OVERLOAD_SCOPE_REDUCTION;
        return OVL_LEVEL_DOWN;
    default:
        s->level--; /* PLAYER_SHEDDING keeps the multiplier it had */
        return OVL_LEVEL_DOWN;
    }
}

ovl_change ovl_feed(ovl_state *s, uint64_t actual_ns, uint64_t budget_ns)
{
    double a = (double)actual_ns, b = (double)budget_ns;
    bool overrun = budget_ns && a > s->cfg.overrun_threshold * b;
    bool calm = budget_ns && a <= s->cfg.calm_ratio * b;
    if (!overrun)
        s->overruns = 0;
    if (!calm)
        s->calm = 0;
    ovl_change c = OVL_STAY;
    if (overrun && ++s->overruns >= s->cfg.escalation_ticks)
        c = step_up(s);
    else if (calm && ++s->calm >= s->cfg.deescalation_ticks)
        c = step_down(s);
    if (c != OVL_STAY)
        s->overruns = s->calm = 0;
    else if (s->overruns >= s->cfg.escalation_ticks || s->calm >= s->cfg.deescalation_ticks)
        s->overruns = s->calm = 0; /* at an end of the chain: the streak starts over, no overflow */
    return c;
}

const char *keel_overload_level_name(keel_overload_level level)
{
    switch (level) {
    case KEEL_OVERLOAD_NORMAL:               return "NORMAL";
    case KEEL_OVERLOAD_SYSTEM_THROTTLING:    return "SYSTEM_THROTTLING";
    case KEEL_OVERLOAD_SCOPE_REDUCTION:      return "SCOPE_REDUCTION";
    case KEEL_OVERLOAD_TICK_RATE_MODULATION: return "TICK_RATE_MODULATION";
    case KEEL_OVERLOAD_PLAYER_SHEDDING:      return "PLAYER_SHEDDING";
    default:                                 return "?";
    }
}
