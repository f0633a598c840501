/*
 * oracle.c -- what a crashed-and-restarted keel-world must show.
 *
 * The reference is keel-world run uninterrupted with the same seed and
 * --report-prefix: the state hash after every tick, after the first j trades
 * of every tick (the market is exclusive and first, so the world then holds
 * tick t-1 plus those j trades exactly), every trade's outcome, and the
 * economy's constants (coins and items over all accounts).
 *
 * Trades are IMMEDIATE side transactions; their records reach the log in
 * commit order and the durable LSN only grows, so the trades on disk always
 * form a prefix of a tick's trades, and a tick's batch follows its trades.
 * A recovered directory must therefore hold exactly reference state R (R =
 * the recovered tick) or "R plus the first j trades of tick R+1", with j
 * covering every trade of tick R+1 that was acknowledged; every acknowledged
 * trade must be in the ledgers (ledger >= id; at ledger == id the values it
 * wrote); the continued run must reproduce the reference hash at every tick
 * to the end (keel-world's ledger makes a re-run trade a no-op); and the
 * economy's invariants hold in every reported state.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "kc.h"

bool kc_verbose;

#define KC_SHOW_PROBLEMS 40

void kc_problem(const kc_lap *lap, uint64_t *counter, const char *fmt, ...)
{
    static uint64_t shown;
    (*counter)++;
    if (shown++ >= KC_SHOW_PROBLEMS) {
        if (shown == KC_SHOW_PROBLEMS + 1)
            printf("problem: (further problems are counted, not shown)\n");
        return;
    }
    printf("problem [%s lap %u child %u]: ", lap ? lap->mode : "reference", lap ? lap->lap : 0, lap ? lap->child : 0);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

/* ---- accounts ------------------------------------------------------------------------- */

static void acct_clear(kc_acct **a, uint64_t *n)
{
    for (uint64_t i = 0; i < *n; i++)
        free((*a)[i].items);
    *n = 0;
}

/* Add an `acct` line; false when it does not parse. */
static bool acct_add(kc_acct **a, uint64_t *n, uint64_t *cap, const kc_line *l)
{
    kc_acct x = {0};
    if (!kc_get_hex(l, "e", &x.e) || !kc_get_i64(l, "coins", &x.coins) || !kc_get_u64(l, "ledger", &x.ledger) ||
        !(x.items = kc_items_canon(kc_get(l, "items"), &x.nitems)))
        return false;
    if (*n == *cap) {
        uint64_t c = *cap ? *cap * 2 : 128;
        kc_acct *na = realloc(*a, c * sizeof *na);
        if (!na) {
            free(x.items);
            return false;
        }
        *a = na;
        *cap = c;
    }
    (*a)[(*n)++] = x;
    return true;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

typedef struct economy {
    int64_t money;
    uint64_t items, dups;
} economy;

/* The economy of a block of accounts, computed from the acct lines
 * themselves (not trusting the child's own sums). */
static economy block_economy(const kc_acct *a, uint64_t n)
{
    economy e = {0};
    for (uint64_t i = 0; i < n; i++) {
        e.money += a[i].coins;
        e.items += a[i].nitems;
    }
    uint64_t *ids = e.items ? malloc(e.items * sizeof *ids) : NULL, k = 0;
    if (!ids)
        return e;
    for (uint64_t i = 0; i < n; i++) {
        if (!strcmp(a[i].items, "-"))
            continue;
        for (const char *p = a[i].items; *p; p++) {
            ids[k++] = strtoull(p, (char **)&p, 10);
            if (!*p)
                break;
        }
    }
    qsort(ids, k, sizeof *ids, cmp_u64);
    for (uint64_t i = 1; i < k; i++)
        e.dups += ids[i] == ids[i - 1] && (i == 1 || ids[i - 1] != ids[i - 2]);
    free(ids);
    return e;
}

static const kc_acct *acct_find(const kc_acct *a, uint64_t n, uint64_t e)
{
    for (uint64_t i = 0; i < n; i++)
        if (a[i].e == e)
            return &a[i];
    return NULL;
}

/* ---- trades --------------------------------------------------------------------------- */

static bool trade_parse(const kc_line *l, uint64_t *id, uint64_t *t, kc_trade *tr)
{
    uint64_t na, nb;
    *tr = (kc_trade){0};
    if (!kc_get_u64(l, "id", id) || !kc_get_u64(l, "t", t) || !kc_get_hex(l, "a", &tr->a) ||
        !kc_get_hex(l, "b", &tr->b) || !kc_get_i64(l, "a_coins", &tr->a_coins) ||
        !kc_get_i64(l, "b_coins", &tr->b_coins) || !(tr->a_items = kc_items_canon(kc_get(l, "a_items"), &na)) ||
        !(tr->b_items = kc_items_canon(kc_get(l, "b_items"), &nb)) || *id == 0 || (*id - 1) / KC_TPT != *t) {
        free(tr->a_items);
        free(tr->b_items);
        *tr = (kc_trade){0};
        return false;
    }
    return true;
}

static void trade_free(kc_trade *t)
{
    free(t->a_items);
    free(t->b_items);
    *t = (kc_trade){0};
}

static bool trade_equal(const kc_trade *x, const kc_trade *y)
{
    return x->a == y->a && x->b == y->b && x->a_coins == y->a_coins && x->b_coins == y->b_coins &&
           !strcmp(x->a_items, y->a_items) && !strcmp(x->b_items, y->b_items);
}

/* ---- the reference -------------------------------------------------------------------- */

typedef struct ref_reader {
    kc_ref *r;
    kc_acct *acct;
    uint64_t nacct, capacct;
    uint64_t ticks;
    bool started;
} ref_reader;

static void ref_fail(kc_ref *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ref_fail(kc_ref *r, const char *fmt, ...)
{
    if (r->err[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
}

static void ref_state_end(ref_reader *rr, const kc_line *l)
{
    kc_ref *r = rr->r;
    economy e = block_economy(rr->acct, rr->nacct);
    int64_t money;
    uint64_t items, dups;
    if (!kc_get_i64(l, "money", &money) || !kc_get_u64(l, "items", &items) || !kc_get_u64(l, "dups", &dups))
        ref_fail(r, "a state-end line that does not parse");
    else if (money != e.money || items != e.items || dups != e.dups || dups)
        ref_fail(r, "state-end money=%" PRId64 " items=%" PRIu64 " dups=%" PRIu64 ", the acct lines sum to %" PRId64
                 " coins, %" PRIu64 " items, %" PRIu64 " held twice", money, items, dups, e.money, e.items, e.dups);
    if (rr->nacct) { /* the last block with accounts: the constants */
        r->money = e.money;
        r->items = e.items;
        r->accounts = rr->nacct;
        r->have_end = true;
    }
    acct_clear(&rr->acct, &rr->nacct);
}

static void ref_line(void *user, const kc_line *l)
{
    ref_reader *rr = user;
    kc_ref *r = rr->r;
    uint64_t t = 0, h = 0, j = 0, id = 0, f = 0;
    if (!l->kind) {
        ref_fail(r, "a report line that does not parse");
    } else if (!strcmp(l->kind, "start")) {
        if (!kc_get_u64(l, "tick", &t) || !kc_get_hex(l, "hash", &h) || !kc_get_u64(l, "fresh", &f) || t || !f)
            ref_fail(r, "the reference did not start a fresh world at tick 0");
        r->hash[0] = h;
        rr->started = true;
    } else if (!strcmp(l->kind, "tick")) {
        if (!kc_get_u64(l, "t", &t) || !kc_get_hex(l, "hash", &h) || t != rr->ticks + 1 || t > r->until)
            ref_fail(r, "tick line out of order (after tick %" PRIu64 ")", rr->ticks);
        else
            r->hash[rr->ticks = t] = h;
    } else if (!strcmp(l->kind, "prefix")) {
        if (!kc_get_u64(l, "t", &t) || !kc_get_u64(l, "j", &j) || !kc_get_hex(l, "hash", &h) || t == 0 ||
            t > r->until || j > KC_TPT)
            ref_fail(r, "a prefix line out of range");
        else {
            r->prefix[t][j] = h;
            r->prefix_have[t] |= (uint16_t)(1u << j);
        }
    } else if (!strcmp(l->kind, "ack")) {
        kc_trade tr;
        if (!trade_parse(l, &id, &t, &tr) || id > r->ntrades)
            ref_fail(r, "an ack line that does not parse or is out of range");
        else if (r->have_trade[id])
            ref_fail(r, "trade %" PRIu64 " acknowledged twice", id), trade_free(&tr);
        else {
            r->trade[id] = tr;
            r->have_trade[id] = true;
        }
    } else if (!strcmp(l->kind, "acct")) {
        if (!acct_add(&rr->acct, &rr->nacct, &rr->capacct, l))
            ref_fail(r, "an acct line that does not parse");
    } else if (!strcmp(l->kind, "state-end")) {
        ref_state_end(rr, l);
    } else if (!strcmp(l->kind, "final")) {
        if (!kc_get_u64(l, "tick", &t) || !kc_get_hex(l, "hash", &r->final_hash) || t != r->until)
            ref_fail(r, "a final line that does not parse or ends before tick %" PRIu64, r->until);
    }
}

/* The reference's own consistency: without it the oracle proves nothing. */
static void ref_check(kc_ref *r, uint64_t ticks)
{
    if (ticks != r->until)
        ref_fail(r, "the reference reported %" PRIu64 " ticks, expected %" PRIu64, ticks, r->until);
    if (r->final_hash != r->hash[r->until])
        ref_fail(r, "the final hash differs from the last tick's");
    if (!r->have_end)
        ref_fail(r, "the reference reported no accounts");
    for (uint64_t t = 1; t <= r->until && !r->err[0]; t++) {
        if (r->prefix_have[t] != (1u << (KC_TPT + 1)) - 1)
            ref_fail(r, "tick %" PRIu64 ": prefix lines for j = 0..%u missing (mask %#x); is --report-prefix "
                     "implemented?", t, KC_TPT, r->prefix_have[t]);
        else if (t >= 2 && r->prefix[t][0] != r->hash[t - 1])
            ref_fail(r, "tick %" PRIu64 ": the state before its first trade differs from tick %" PRIu64 "'s", t, t - 1);
        for (uint32_t k = 0; k < KC_TPT; k++)
            if (!r->have_trade[t * KC_TPT + k + 1])
                ref_fail(r, "trade %" PRIu64 " (tick %" PRIu64 ") was not acknowledged", t * KC_TPT + k + 1, t);
    }
}

int kc_ref_build(kc_ref *r, const kc_spec *s, char *why, size_t cap)
{
    memset(r, 0, sizeof *r);
    r->until = s->until;
    r->ntrades = (s->until + 1) * KC_TPT;
    r->hash = calloc(s->until + 2, sizeof *r->hash);
    r->prefix = calloc(s->until + 2, sizeof *r->prefix);
    r->prefix_have = calloc(s->until + 2, sizeof *r->prefix_have);
    r->trade = calloc(r->ntrades + 1, sizeof *r->trade);
    r->have_trade = calloc(r->ntrades + 1, sizeof *r->have_trade);
    if (!r->hash || !r->prefix || !r->prefix_have || !r->trade || !r->have_trade) {
        snprintf(why, cap, "out of memory");
        return -1;
    }
    ref_reader rr = {.r = r};
    kc_exit ex;
    if (kc_child_run(s, ref_line, &rr, &ex)) {
        snprintf(why, cap, "cannot start %s", s->world);
        return -1;
    }
    acct_clear(&rr.acct, &rr.nacct);
    free(rr.acct);
    if (kc_stop) {
        snprintf(why, cap, "interrupted");
        return -1;
    }
    if (!WIFEXITED(ex.status) || WEXITSTATUS(ex.status) != 0 || !rr.started) {
        snprintf(why, cap, "the reference run (%s --memory --report-fd ...) %s %d%s", s->world,
                 WIFEXITED(ex.status) ? "exited with" : "died by signal",
                 WIFEXITED(ex.status) ? WEXITSTATUS(ex.status) : WTERMSIG(ex.status),
                 rr.started ? "" : " before its start line (does it know --report-fd?)");
        return -1;
    }
    ref_check(r, rr.ticks);
    if (r->err[0]) {
        snprintf(why, cap, "the reference run is inconsistent: %s", r->err);
        return -1;
    }
    return 0;
}

void kc_ref_free(kc_ref *r)
{
    for (uint64_t i = 0; r->trade && i <= r->ntrades; i++)
        trade_free(&r->trade[i]);
    free(r->hash);
    free(r->prefix);
    free(r->prefix_have);
    free(r->trade);
    free(r->have_trade);
    memset(r, 0, sizeof *r);
}

/* ---- a lap and its children ----------------------------------------------------------- */

void kc_lap_init(kc_lap *lap, const kc_ref *ref, kc_stats *st, const char *mode, uint32_t n)
{
    *lap = (kc_lap){.ref = ref, .st = st, .mode = mode, .lap = n};
    lap->acked = calloc(ref->ntrades + 1, 1);
    lap->ack = calloc(ref->ntrades + 1, sizeof *lap->ack);
    const char *self = getenv("KEEL_CRASH_SELFTEST");
    lap->selftest_ack = self && !strcmp(self, "ack");
    lap->selftest_epoch = self && !strcmp(self, "epoch");
    lap->selftest_money = self && !strcmp(self, "money") ? 1 : 0;
}

int kc_lap_epochs(kc_lap *lap)
{
    lap->ack_epoch = calloc(lap->ref->ntrades + 1, sizeof *lap->ack_epoch);
    return lap->ack_epoch ? 0 : -1;
}

void kc_lap_free(kc_lap *lap)
{
    free(lap->ack_epoch);
    lap->ack_epoch = NULL;
    for (uint64_t i = 0; lap->ack && i <= lap->ref->ntrades; i++)
        trade_free(&lap->ack[i]);
    free(lap->acked);
    free(lap->ack);
    lap->acked = NULL;
    lap->ack = NULL;
}

void kc_run_init(kc_run *run, kc_lap *lap, bool immediate)
{
    *run = (kc_run){.lap = lap, .immediate = immediate, .j = -1};
    lap->child++;
}

void kc_run_free(kc_run *run)
{
    acct_clear(&run->acct, &run->nacct);
    free(run->acct);
    run->acct = NULL;
    run->capacct = 0;
}

static void stats_tick(kc_stats *st, uint64_t R)
{
    if (st->nrticks == st->caprticks) {
        uint64_t c = st->caprticks ? st->caprticks * 2 : 256;
        uint64_t *n = realloc(st->rticks, c * sizeof *n);
        if (!n)
            return;
        st->rticks = n;
        st->caprticks = c;
    }
    st->rticks[st->nrticks++] = R;
}

/* Which reference state is this hash? For the message only. */
static void describe_state(const kc_ref *ref, uint64_t h, char *out, size_t cap)
{
    out[0] = '\0';
    for (uint64_t t = 0; t <= ref->until; t++) {
        if (ref->hash[t] == h) {
            snprintf(out, cap, "; it is the reference state of tick %" PRIu64, t);
            return;
        }
        for (uint32_t j = 0; t >= 1 && j <= KC_TPT; j++)
            if ((ref->prefix_have[t] >> j & 1) && ref->prefix[t][j] == h) {
                snprintf(out, cap, "; it is the reference state of tick %" PRIu64 " plus %u trades of tick %" PRIu64,
                         t - 1, j, t);
                return;
            }
    }
}

/* Must this run's state hold acknowledged trade `id`? Always, except in
 * failover mode: at its start only trades of earlier epochs, later on those
 * of its own epoch too. */
static bool required(const kc_run *run, uint64_t id, bool at_start)
{
    const kc_lap *lap = run->lap;
    if (!lap->ack_epoch || !run->has_epoch)
        return true;
    return at_start ? lap->ack_epoch[id] < run->epoch : lap->ack_epoch[id] <= run->epoch;
}

/* A trade is in recovered state (R, j) when it ran at a tick <= R or among
 * the first j trades of tick R + 1. */
bool kc_trade_in_state(uint64_t id, uint64_t R, int j)
{
    uint64_t t = (id - 1) / KC_TPT, k = (id - 1) % KC_TPT;
    return t <= R || (t == R + 1 && j >= 0 && k < (uint64_t)j);
}

static void lost(kc_run *run, uint64_t id, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void lost(kc_run *run, uint64_t id, const char *fmt, ...)
{
    kc_lap *lap = run->lap;
    if (lap->acked[id] != 1)
        return; /* each lost trade counts once */
    lap->acked[id] = 2;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kc_problem(lap, &lap->st->lost, "acknowledged trade %" PRIu64 " (tick %" PRIu64 ") lost: %s", id,
               (id - 1) / KC_TPT, msg);
}

static void on_start(kc_run *run, const kc_line *l)
{
    kc_lap *lap = run->lap;
    const kc_ref *ref = lap->ref;
    uint64_t R, h, fresh;
    if (!kc_get_u64(l, "tick", &R) || !kc_get_hex(l, "hash", &h) || !kc_get_u64(l, "fresh", &fresh)) {
        kc_problem(lap, &lap->st->violations, "a start line that does not parse");
        return;
    }
    run->started = true;
    run->fresh = fresh != 0;
    run->has_epoch = kc_get_u64(l, "epoch", &run->epoch);
    lap->openable |= !run->fresh;
    run->R = R;
    run->rec_hash = h;
    run->last_tick = R;
    lap->st->recoveries++;
    stats_tick(lap->st, R);
    if (R > ref->until) {
        kc_problem(lap, &lap->st->mismatches, "recovered tick %" PRIu64 " is past the reference's end", R);
        lap->broken = true;
        return;
    }
    if (R > lap->max_ran + 1)
        kc_problem(lap, &lap->st->violations, "recovered tick %" PRIu64 ", but no child got past tick %" PRIu64
                   " (+1 unreported): recovery went past what ran", R, lap->max_ran);
    if (R < lap->min_durable && !lap->ack_epoch) /* failover mode checks durable ticks by epoch */
        kc_problem(lap, &lap->st->lost, "recovered tick %" PRIu64 ", but tick %" PRIu64 " was durable (an IMMEDIATE "
                   "tick or a clean exit reported it): %" PRIu64 " acknowledged ticks lost", R, lap->min_durable,
                   lap->min_durable - R);
    if (h == ref->hash[R])
        run->j = 0;
    for (uint32_t j = 0; run->j < 0 && R + 1 <= ref->until && j <= KC_TPT; j++)
        if (ref->prefix[R + 1][j] == h)
            run->j = (int)j;
    if (run->j < 0) {
        char near[160];
        describe_state(ref, h, near, sizeof near);
        kc_problem(lap, &lap->st->mismatches, "recovered tick %" PRIu64 " holds state %016" PRIx64 ", which is no "
                   "reference state of that tick (reference %016" PRIx64 ")%s", R, h, ref->hash[R], near);
        lap->broken = true;
    }
    lap->st->mid_tick += run->j > 0;
    for (uint64_t id = 1; id <= ref->ntrades; id++)
        if (lap->acked[id] == 1 && required(run, id, true) && !kc_trade_in_state(id, R, run->j < 0 ? 0 : run->j))
            lost(run, id, "recovered tick %" PRIu64 " with %d trades of tick %" PRIu64, R, run->j < 0 ? 0 : run->j,
                 R + 1);
    lap->pos = R;
    if (R > lap->max_ran)
        lap->max_ran = R;
}

/* Every acknowledged trade is in the ledgers, with the values it wrote
 * where it was the account's last trade. */
static void check_ledgers(kc_run *run, const char *when)
{
    kc_lap *lap = run->lap;
    for (uint64_t id = 1; id <= lap->ref->ntrades; id++) {
        if (lap->acked[id] != 1 || !required(run, id, run->blocks == 0))
            continue;
        const kc_trade *k = &lap->ack[id];
        const kc_acct *a = acct_find(run->acct, run->nacct, k->a), *b = acct_find(run->acct, run->nacct, k->b);
        if (!a || !b)
            lost(run, id, "%s: account %016" PRIx64 " is missing", when, a ? k->b : k->a);
        else if (a->ledger < id || b->ledger < id)
            lost(run, id, "%s: ledgers %" PRIu64 " and %" PRIu64 " (accounts %016" PRIx64 ", %016" PRIx64 ")", when,
                 a->ledger, b->ledger, k->a, k->b);
        else if (a->ledger == id && (a->coins != k->a_coins || strcmp(a->items, k->a_items)))
            lost(run, id, "%s: account %016" PRIx64 " holds coins=%" PRId64 " items=%s, the trade wrote coins=%" PRId64
                 " items=%s", when, k->a, a->coins, a->items, k->a_coins, k->a_items);
        else if (b->ledger == id && (b->coins != k->b_coins || strcmp(b->items, k->b_items)))
            lost(run, id, "%s: account %016" PRIx64 " holds coins=%" PRId64 " items=%s, the trade wrote coins=%" PRId64
                 " items=%s", when, k->b, b->coins, b->items, k->b_coins, k->b_items);
    }
}

static void on_state_end(kc_run *run, const kc_line *l)
{
    kc_lap *lap = run->lap;
    const kc_ref *ref = lap->ref;
    const char *when = run->blocks == 0 ? "after recovery" : "at the end";
    int64_t money;
    uint64_t items, dups;
    economy e = block_economy(run->acct, run->nacct);
    int64_t want_money = ref->money + lap->selftest_money;
    if (!kc_get_i64(l, "money", &money) || !kc_get_u64(l, "items", &items) || !kc_get_u64(l, "dups", &dups))
        kc_problem(lap, &lap->st->violations, "a state-end line that does not parse");
    else if (money != e.money || items != e.items || dups != e.dups)
        kc_problem(lap, &lap->st->violations, "%s: state-end says money=%" PRId64 " items=%" PRIu64 " dups=%" PRIu64
                   ", the acct lines sum to %" PRId64 " coins, %" PRIu64 " items, %" PRIu64 " held twice", when,
                   money, items, dups, e.money, e.items, e.dups);
    else if (run->nacct == 0 && (run->blocks > 0 || run->R > 0))
        kc_problem(lap, &lap->st->violations, "%s (tick %" PRIu64 "): no accounts", when,
                   run->blocks ? run->last_tick : run->R);
    else if (run->nacct && (e.money != want_money || e.items != ref->items || e.dups || run->nacct != ref->accounts))
        kc_problem(lap, &lap->st->violations, "%s (tick %" PRIu64 "): %" PRIu64 " accounts hold %" PRId64 " coins "
                   "and %" PRIu64 " items, %" PRIu64 " of them held twice; the economy has %" PRIu64 " accounts, %"
                   PRId64 " coins, %" PRIu64 " items", when, run->blocks ? run->last_tick : run->R, run->nacct,
                   e.money, e.items, e.dups, ref->accounts, want_money, ref->items);
    check_ledgers(run, when);
    run->blocks++;
    run->in_block = false;
    acct_clear(&run->acct, &run->nacct);
}

static void on_tick(kc_run *run, const kc_line *l)
{
    kc_lap *lap = run->lap;
    uint64_t t, h;
    if (!kc_get_u64(l, "t", &t) || !kc_get_hex(l, "hash", &h)) {
        kc_problem(lap, &lap->st->violations, "a tick line that does not parse");
        return;
    }
    if (!run->started || t != run->last_tick + 1)
        kc_problem(lap, &lap->st->violations, "tick %" PRIu64 " reported after tick %" PRIu64 "%s", t, run->last_tick,
                   run->started ? "" : " without a start line");
    run->last_tick = t;
    run->ticks++;
    if (t > lap->ref->until)
        kc_problem(lap, &lap->st->violations, "tick %" PRIu64 " is past --until-tick", t);
    else if (h != lap->ref->hash[t] && !run->diverged) {
        run->diverged = lap->broken = true; /* every later tick differs too: count the divergence once */
        kc_problem(lap, &lap->st->mismatches, "the run continued after recovering tick %" PRIu64 " (+%d trades) "
                   "diverges at tick %" PRIu64 ": hash %016" PRIx64 ", reference %016" PRIx64, run->R, run->j, t, h,
                   lap->ref->hash[t]);
    }
    if (t > lap->max_ran)
        lap->max_ran = t;
    if (run->immediate && t > lap->min_durable)
        lap->min_durable = t;
    lap->pos = t;
}

static void on_ack(kc_run *run, const kc_line *l)
{
    kc_lap *lap = run->lap;
    const kc_ref *ref = lap->ref;
    uint64_t id, t;
    kc_trade tr;
    if (!trade_parse(l, &id, &t, &tr) || id > ref->ntrades) {
        kc_problem(lap, &lap->st->violations, "an ack line that does not parse or is out of range");
        return;
    }
    run->acks++;
    if (!trade_equal(&tr, &ref->trade[id]) && !run->diverged) {
        run->diverged = lap->broken = true;
        kc_problem(lap, &lap->st->mismatches, "trade %" PRIu64 " (tick %" PRIu64 ") wrote %016" PRIx64 "=%" PRId64
                   " %016" PRIx64 "=%" PRId64 ", the reference's wrote %016" PRIx64 "=%" PRId64 " %016" PRIx64
                   "=%" PRId64, id, t, tr.a, tr.a_coins, tr.b, tr.b_coins, ref->trade[id].a, ref->trade[id].a_coins,
                   ref->trade[id].b, ref->trade[id].b_coins);
    }
    /* KEEL_CRASH_SELFTEST=ack books it a tick late: the oracle must then see losses */
    uint64_t book = lap->selftest_ack ? id + KC_TPT : id;
    if (book > ref->ntrades) {
        trade_free(&tr);
        return;
    }
    uint64_t epoch = lap->selftest_epoch ? 0 : run->epoch;
    if (lap->ack_epoch && (lap->acked[book] == 0 || epoch < lap->ack_epoch[book]))
        lap->ack_epoch[book] = epoch; /* the earliest epoch that acknowledged it binds */
    if (lap->acked[book] == 0) {
        trade_free(&lap->ack[book]);
        lap->ack[book] = tr;
        lap->acked[book] = 1;
    } else {
        trade_free(&tr); /* acknowledged again after a restart: the first values stand */
    }
}

static void on_final(kc_run *run, const kc_line *l)
{
    kc_lap *lap = run->lap;
    if (!kc_get_u64(l, "tick", &run->final_tick) || !kc_get_hex(l, "hash", &run->final_hash)) {
        kc_problem(lap, &lap->st->violations, "a final line that does not parse");
        return;
    }
    run->final_seen = true;
    if (run->final_tick != lap->ref->until)
        kc_problem(lap, &lap->st->violations, "final tick %" PRIu64 ", --until-tick was %" PRIu64, run->final_tick,
                   lap->ref->until);
    else if (run->final_hash != lap->ref->final_hash)
        kc_problem(lap, &lap->st->mismatches, "final hash %016" PRIx64 ", reference %016" PRIx64 " (recovered tick %"
                   PRIu64 ")", run->final_hash, lap->ref->final_hash, run->R), lap->broken = true;
}

void kc_run_line(void *user, const kc_line *l)
{
    kc_run *run = user;
    kc_lap *lap = run->lap;
    if (!l->kind) {
        if (!run->bad_line)
            kc_problem(lap, &lap->st->violations, "a report line that does not parse");
        run->bad_line = true;
    } else if (!strcmp(l->kind, "start")) {
        on_start(run, l);
    } else if (!strcmp(l->kind, "acct")) {
        run->in_block = true;
        if (!acct_add(&run->acct, &run->nacct, &run->capacct, l))
            kc_problem(lap, &lap->st->violations, "an acct line that does not parse");
    } else if (!strcmp(l->kind, "state-end")) {
        on_state_end(run, l);
    } else if (!strcmp(l->kind, "tick")) {
        on_tick(run, l);
    } else if (!strcmp(l->kind, "ack")) {
        on_ack(run, l);
    } else if (!strcmp(l->kind, "final")) {
        on_final(run, l);
    }
    /* other kinds (prefix, future ones) carry nothing a restarted run must match */
}

bool kc_run_end(kc_run *run, const kc_exit *ex, const char *fault, double rec_ms, const char *log_tail)
{
    kc_lap *lap = run->lap;
    kc_stats *st = lap->st;
    int st_ = ex->status;
    bool exited = WIFEXITED(st_), sigkill = WIFSIGNALED(st_) && WTERMSIG(st_) == SIGKILL;
    bool crashed = true;
    if (run->started && !run->fresh && rec_ms >= 0) {
        st->rec_ms_sum += rec_ms;
        st->rec_ms_n++;
    }
    if (ex->hung) {
        kc_problem(lap, &st->violations, "the child went silent for too long (a hang?) and was killed; its last "
                   "words: %s", log_tail);
    } else if (ex->killed || (sigkill && fault && (!strcmp(fault, "crash") || !strcmp(fault, "powerloss")))) {
        /* the crash that was planned */
    } else if (exited && WEXITSTATUS(st_) == 0) {
        crashed = false;
        if (!run->final_seen)
            kc_problem(lap, &st->violations, "the child exited 0 without a final line");
        else if (run->blocks < 2 && run->started)
            kc_problem(lap, &st->violations, "the child exited 0 without reporting its accounts at the end");
        lap->min_durable = run->final_seen ? run->final_tick : lap->min_durable; /* a clean close syncs */
        lap->pos = lap->max_ran = lap->ref->until;
        lap->reached_end = lap->openable = true;
    } else if (exited && fault && (!strcmp(fault, "eio") || !strcmp(fault, "fenced"))) {
        /* an injected I/O error, or another primary took over: the runtime latched fatal and keel-world gave up */
    } else if (exited && !run->started) {
        kc_problem(lap, &st->mismatches, "no state recovered: keel-world exited with %d before its start line: %s",
                   WEXITSTATUS(st_), log_tail);
        lap->broken = true;
    } else if (exited) {
        kc_problem(lap, &st->violations, "keel-world exited with %d after tick %" PRIu64 " with no fault injected: %s",
                   WEXITSTATUS(st_), run->last_tick, log_tail);
    } else {
        kc_problem(lap, &st->violations, "keel-world died by signal %d (%s injected) after tick %" PRIu64 ": %s",
                   WIFSIGNALED(st_) ? WTERMSIG(st_) : -1, fault ? fault : "nothing", run->last_tick, log_tail);
    }
    if (crashed)
        st->crashes++;
    return crashed;
}
