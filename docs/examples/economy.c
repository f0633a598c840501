/*
 * economy.c -- money moved between accounts by client threads, each transfer
 * durable before the client is told "done", each applied exactly once.
 *
 * Build against an installed keel:  cc economy.c $(pkg-config --cflags --libs keel)
 * Run it twice: the second run recovers the accounts from ./economy-data and
 * refuses every transfer as already applied (same idempotency keys).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include "keel/keel.h"

enum { ACCOUNTS = 8, THREADS = 4, TRANSFERS = 25, START = 1000 };

typedef struct account { int64_t balance; } account;
static const keel_field account_fields[] = {{.name = "balance", .type = KEEL_I64}};
static keel_component ACCOUNT;
static keel_entity accounts[ACCOUNTS];

/* The first tick of a new world opens the accounts (a recovered one has them). */
static int open_accounts(keel_ctx *ctx, void *user)
{
    (void)user;
    account a = {START};
    for (int i = 0; keel_world_count(keel_ctx_world(ctx)) == 0 && i < ACCOUNTS; i++)
        keel_cmd_spawn(keel_ctx_commands(ctx), &(keel_init){ACCOUNT, &a}, 1);
    return 0;
}

typedef struct transfer { uint64_t key; int from, to; int64_t amount; } transfer;

/* Runs at the next tick start in its own side transaction: return 0 to commit. */
static int do_transfer(keel_side_txn *tx, void *arg)
{
    transfer *t = arg;
    account a, b;
    keel_side_txn_set_key(tx, t->key); /* a retry or a duplicate of this transfer applies nothing */
    int rc = keel_side_get(tx, accounts[t->from], ACCOUNT, &a);
    if (!rc)
        rc = keel_side_get(tx, accounts[t->to], ACCOUNT, &b);
    if (rc || a.balance < t->amount)
        return rc ? rc : 1; /* insufficient funds: refused, nothing applied */
    a.balance -= t->amount;
    b.balance += t->amount;
    rc = keel_side_set(tx, accounts[t->from], ACCOUNT, &a);
    return rc ? rc : keel_side_set(tx, accounts[t->to], ACCOUNT, &b);
}

/* Submit until it is not a conflict; IMMEDIATE: the ticket completes once on disk. */
static int submit(keel_runtime *rt, transfer *t)
{
    int rc;
    do {
        keel_ticket *ticket;
        if ((rc = keel_submit(rt, do_transfer, t, KEEL_DURABLE_IMMEDIATE, &ticket)))
            return rc;
        rc = keel_ticket_wait(ticket, -1);
        keel_ticket_release(ticket);
    } while (rc == KEEL_ECONFLICT);
    return rc;
}

static void *client(void *arg)
{
    keel_runtime *rt = arg;
    static _Atomic int next_id;
    int id = next_id++, done = 0, refused = 0, already = 0, dups = 0;
    for (int i = 0; i < TRANSFERS; i++) {
        transfer t = {(uint64_t)(id + 1) << 32 | (uint64_t)(i + 1), (id + i) % ACCOUNTS, (id + 3 * i + 1) % ACCOUNTS,
                      10 + i};
        int rc = submit(rt, &t);
        if (rc == 0 && i == 0) /* the client sends its first one twice: the copy applies nothing */
            dups += submit(rt, &t) == KEEL_EALREADY;
        done += rc == 0, refused += rc == 1, already += rc == KEEL_EALREADY;
        if (rc != 0 && rc != 1 && rc != KEEL_EALREADY)
            fprintf(stderr, "transfer %d/%d: %s: %s\n", id, i, keel_strerror(rc), keel_last_error());
    }
    printf("client %d: %d transfers done (durable), %d refused, %d already applied, %d duplicate refused\n", id,
           done, refused, already, dups);
    return NULL;
}

int main(void)
{
    keel_runtime *rt;
    keel_runtime_desc desc = {.tick_rate_hz = 1000, .durable = {.dir = "economy-data"},
                              .on_first_tick = open_accounts};
    keel_schedule *s;
    if (keel_runtime_create(&desc, &rt) ||
        keel_component_register(keel_runtime_world(rt), &(keel_component_desc){.name = "account", .size = 8,
                                .fields = account_fields, .field_count = 1}, &ACCOUNT) ||
        keel_schedule_create(rt, &s) || keel_schedule_build(s) || keel_runtime_set_schedule(rt, s) ||
        keel_runtime_step(rt)) { /* recovers ./economy-data, then the first tick */
        fprintf(stderr, "economy: %s\n", keel_last_error());
        return 1;
    }
    keel_query *q;
    keel_iter it;
    int n = 0;
    keel_query_create(keel_runtime_world(rt), &(keel_query_desc){.with = {ACCOUNT}}, &q);
    for (keel_query_iter(q, &it); keel_iter_next(&it);)
        for (uint32_t r = 0; r < it.count && n < ACCOUNTS; r++)
            accounts[n++] = it.entities[r];
    keel_query_destroy(q);

    pthread_t th[THREADS];
    keel_runtime_start(rt); /* ticks run while the clients submit */
    for (int i = 0; i < THREADS; i++)
        pthread_create(&th[i], NULL, client, rt);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    keel_runtime_stop(rt);

    int64_t total = 0;
    for (int i = 0; i < ACCOUNTS; i++) {
        account a;
        keel_get(keel_runtime_world(rt), accounts[i], ACCOUNT, &a);
        total += a.balance;
    }
    keel_runtime_close(rt);
    printf("total %" PRId64 " (expected %d)\n", total, ACCOUNTS * START);
    return n == ACCOUNTS && total == ACCOUNTS * START ? 0 : 1;
}
