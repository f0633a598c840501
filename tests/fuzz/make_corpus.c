/*
 * tests/fuzz/make_corpus.c -- writes the seed corpus of the fuzz targets
 * from real data directories.
 *
 *   make_corpus OUTDIR        writes OUTDIR/record/ and OUTDIR/reader/
 *
 * A short durable workload runs in a temporary directory (one worker, so
 * the records are the same every time): spawns and destroys, tags and a
 * value component added and removed, VERSIONED, SINGLE_VERSION and
 * TRANSIENT components, IMMEDIATE and GROUP side transactions and a
 * DEFERRED submitted closure, a checkpoint (WAL retained). A second run
 * reopens the directory with one more component (a new SCHEMA record,
 * a HOOK unit after recovery), checkpoints again without retaining the
 * WAL, and stops.
 *
 * record/: a few real records of every kind (WAL and snap), plus hand-made
 * edge cases (edge-*). reader/: each run's data directory serialized in
 * fuzz_reader's entry format (wal, snap, meta "checkpoint", schema), plus
 * hand-made directories (edge-*). docs/testing.md says how to refresh the
 * committed corpus (tests/fuzz/corpus) with it.
 *
 * The schema registered here is fz_corpus_schema() (fuzz_common.c); the
 * program fails if the two drift apart.
 */
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "fuzz_common.h"
#include "keel/keel.h"

#define AGENTS 24
#define WALLETS 3

static const char *out_dir;
static unsigned long files_written, bytes_written;

static void die(const char *what, int rc)
{
    fprintf(stderr, "make_corpus: %s: %s: %s\n", what, keel_strerror(rc), keel_last_error());
    exit(1);
}

/* Write OUTDIR/sub/name; false when the same bytes were written before. */
static bool write_file(const char *sub, const char *name, const void *p, size_t n)
{
    /* the same bytes twice (the schema is in the schema db and the WAL) add nothing */
    static uint32_t seen[256];
    static size_t nseen;
    uint32_t crc = kw_crc32c(kw_crc32c((uint32_t)n, sub, strlen(sub)), p, n);
    for (size_t i = 0; i < nseen; i++)
        if (seen[i] == crc)
            return false;
    if (nseen < sizeof seen / sizeof seen[0])
        seen[nseen++] = crc;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s", out_dir, sub, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f)) {
        fprintf(stderr, "make_corpus: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    files_written++;
    bytes_written += n;
    return true;
}

/* ---- the workload -------------------------------------------------------------- */

typedef struct pos2 { float x, y; } pos2;
typedef struct wallet { int64_t coins; uint64_t ledger; } wallet;
typedef struct bits { uint8_t a, b; uint16_t c; int16_t d[2]; } bits;

typedef struct app {
    keel_runtime *rt;
    keel_world *w;
    keel_component pos, hp, cache, label, marked, wallet, owner, bits, extra;
} app;

static keel_entity wallet_entity(uint32_t i)
{
    return KEEL_ENTITY_MAKE(i, 1);
}

static int spawn_agent(app *a, keel_cmdbuf *cb, uint64_t tick, uint32_t k)
{
    pos2 p = {(float)k, (float)tick};
    int32_t hp = 20 + (int32_t)((k * 7 + tick) % 30);
    char label[16] = {0};
    snprintf(label, sizeof label, "agent-%llu-%u", (unsigned long long)tick, k);
    bits b = {(uint8_t)k, (uint8_t)(k & 1), (uint16_t)tick, {(int16_t)-k, 7}};
    keel_init in[] = {{a->pos, &p}, {a->hp, &hp}, {a->cache, NULL}, {a->label, label}, {a->bits, &b}};
    return keel_cmd_spawn(cb, in, 5);
}

static int populate(keel_ctx *ctx, void *user)
{
    app *a = user;
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    if (keel_world_count(a->w))
        return 0; /* recovered: the hook unit stays empty */
    int rc = 0;
    for (uint32_t i = 0; !rc && i < WALLETS; i++) {
        wallet wl = {1000, 0};
        char label[16] = "wallet";
        rc = keel_cmd_spawn(cb, (keel_init[]){{a->wallet, &wl}, {a->label, label}}, 2);
    }
    for (uint32_t k = 0; !rc && k < AGENTS; k++)
        rc = spawn_agent(a, cb, 0, k);
    return rc;
}

static int move_fn(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)user;
    uint64_t t = keel_ctx_tick(ctx);
    pos2 *p = KEEL_COLUMN(it, pos2, 0);
    uint64_t *cache = KEEL_COLUMN(it, uint64_t, 1);
    for (uint32_t i = 0; i < it->count; i++) {
        cache[i] = t; /* TRANSIENT: never in the WAL */
        if ((KEEL_ENTITY_INDEX(it->entities[i]) + t) % 3 == 0) {
            p[i].x += 1.5f;
            p[i].y -= 0.25f;
        }
    }
    return 0;
}

static int decay_fn(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)user;
    uint64_t t = keel_ctx_tick(ctx);
    int32_t *hp = KEEL_COLUMN(it, int32_t, 0);
    bits *b = KEEL_COLUMN(it, bits, 1);
    int rc = 0;
    for (uint32_t i = 0; !rc && i < it->count; i++) {
        hp[i] -= 3;
        b[i].c = (uint16_t)t;
        if (hp[i] % 11 == 0)
            rc = keel_cmd_destroy(keel_ctx_commands(ctx), it->entities[i]);
    }
    return rc;
}

static int tagger_fn(keel_ctx *ctx, const keel_iter *it, void *user)
{
    app *a = user;
    uint64_t t = keel_ctx_tick(ctx);
    int rc = 0;
    for (uint32_t i = 0; !rc && i < it->count; i++) {
        uint32_t idx = KEEL_ENTITY_INDEX(it->entities[i]);
        if ((idx + t) % 5 == 0)
            rc = keel_cmd_add(keel_ctx_commands(ctx), it->entities[i], a->marked, NULL);
        if (!rc && (idx + t) % 7 == 0) {
            keel_entity who = wallet_entity(idx % WALLETS);
            rc = keel_cmd_add(keel_ctx_commands(ctx), it->entities[i], a->owner, &who);
        }
    }
    return rc;
}

/* Remove `c` from the rows whose (index + tick) % every == 0. */
typedef struct remover {
    keel_component c;
    uint64_t every;
} remover;

static int remove_fn(keel_ctx *ctx, const keel_iter *it, void *user)
{
    const remover *r = user;
    uint64_t t = keel_ctx_tick(ctx);
    int rc = 0;
    for (uint32_t i = 0; !rc && i < it->count; i++)
        if ((KEEL_ENTITY_INDEX(it->entities[i]) + t) % r->every == 0)
            rc = keel_cmd_remove(keel_ctx_commands(ctx), it->entities[i], r->c);
    return rc;
}

static int spawner(keel_ctx *ctx, void *user)
{
    app *a = user;
    uint64_t t = keel_ctx_tick(ctx);
    int rc = 0;
    for (uint32_t k = 0; !rc && k < 2; k++)
        rc = spawn_agent(a, keel_ctx_commands(ctx), t, k);
    return rc;
}

/* Move coins between two wallets in a side transaction of `mode`. */
static int transfer(app *a, keel_side_txn *tx, uint32_t from, uint32_t to, int64_t amount, uint64_t id)
{
    wallet wa, wb;
    int rc;
    if ((rc = keel_side_get(tx, wallet_entity(from), a->wallet, &wa)) ||
        (rc = keel_side_get(tx, wallet_entity(to), a->wallet, &wb)))
        return rc;
    wa.coins -= amount;
    wb.coins += amount;
    wa.ledger = wb.ledger = id;
    if ((rc = keel_side_set(tx, wallet_entity(from), a->wallet, &wa)))
        return rc;
    return keel_side_set(tx, wallet_entity(to), a->wallet, &wb);
}

static int bank(keel_ctx *ctx, void *user)
{
    app *a = user;
    uint64_t t = keel_ctx_tick(ctx);
    static const keel_durability modes[] = {KEEL_DURABLE_IMMEDIATE, KEEL_DURABLE_GROUP};
    int rc = 0;
    for (uint32_t k = 0; !rc && k < 2; k++) {
        keel_side_txn *tx;
        if ((rc = keel_side_txn_begin(ctx, modes[k], &tx)))
            break;
        if ((rc = transfer(a, tx, (uint32_t)(t + k) % WALLETS, (uint32_t)(t + k + 1) % WALLETS, 10 + (int64_t)k,
                           t * 2 + k))) {
            keel_side_txn_abort(tx);
            break;
        }
        rc = keel_side_txn_commit(tx);
    }
    return rc;
}

static int deposit(keel_side_txn *tx, void *arg)
{
    app *a = arg;
    wallet wl;
    int rc = keel_side_get(tx, wallet_entity(WALLETS - 1), a->wallet, &wl);
    wl.coins += 100;
    return rc ? rc : keel_side_set(tx, wallet_entity(WALLETS - 1), a->wallet, &wl);
}

static const keel_field f_pos[] = {{"x", KEEL_F32, 0, 1}, {"y", KEEL_F32, 4, 1}};
static const keel_field f_hp[] = {{"v", KEEL_I32, 0, 1}};
static const keel_field f_cache[] = {{"v", KEEL_U64, 0, 1}};
static const keel_field f_label[] = {{"text", KEEL_BYTES, 0, 16}};
static const keel_field f_wallet[] = {{"coins", KEEL_I64, 0, 1}, {"ledger", KEEL_U64, 8, 1}};
static const keel_field f_owner[] = {{"who", KEEL_ENTITY, 0, 1}};
static const keel_field f_bits[] = {{"a", KEEL_U8, 0, 1}, {"b", KEEL_BOOL, 1, 1}, {"c", KEEL_U16, 2, 1},
                                    {"d", KEEL_I16, 4, 2}};
static const keel_field f_extra[] = {{"v", KEEL_U32, 0, 1}};

static void app_open(app *a, const char *dir, bool extra, bool retain)
{
    keel_runtime_desc d = {
        .world = {.chunk_rows = 16},
        .workers = 1,
        .tick_rate_hz = -1,
        .durable = {.dir = dir, .checkpoint_every_ticks = -1, .checkpoint_every_bytes = -1,
                    .checkpoint_every_seconds = -1, .wal_retain = retain},
        .on_first_tick = populate,
        .hook_user = a,
    };
    int rc = keel_runtime_create(&d, &a->rt);
    if (rc)
        die("keel_runtime_create", rc);
    a->w = keel_runtime_world(a->rt);
    const keel_component_desc comps[] = {
        {.name = "pos", .size = 8, .align = 4, .fields = f_pos, .field_count = 2},
        {.name = "hp", .size = 4, .align = 4, .discipline = KEEL_SINGLE_VERSION, .fields = f_hp, .field_count = 1},
        {.name = "cache", .size = 8, .align = 8, .discipline = KEEL_TRANSIENT, .fields = f_cache, .field_count = 1},
        {.name = "label", .size = 16, .align = 1, .fields = f_label, .field_count = 1},
        {.name = "marked"},
        {.name = "wallet", .size = 16, .align = 8, .fields = f_wallet, .field_count = 2},
        {.name = "owner", .size = 8, .align = 8, .fields = f_owner, .field_count = 1},
        {.name = "bits", .size = 8, .align = 4, .discipline = KEEL_SINGLE_VERSION, .fields = f_bits, .field_count = 4},
        {.name = "extra", .size = 4, .align = 4, .fields = f_extra, .field_count = 1},
    };
    keel_component *ids[] = {&a->pos, &a->hp, &a->cache, &a->label, &a->marked,
                             &a->wallet, &a->owner, &a->bits, &a->extra};
    size_t n = sizeof comps / sizeof comps[0] - !extra;
    for (size_t i = 0; !rc && i < n; i++)
        rc = keel_component_register(a->w, &comps[i], ids[i]);
    keel_schedule *s = NULL;
    if (rc || (rc = keel_schedule_create(a->rt, &s)))
        die("registering the components", rc);
    static remover untag, disown;
    untag = (remover){a->marked, 2};
    disown = (remover){a->owner, 3};
    keel_system_desc sys[] = {
        {.name = "bank", .kind = KEEL_SYSTEM_CALLBACK, .run = bank, .user = a,
         .access = {.side_writes = {a->wallet}, .exclusive = true},
         .before = {"move", "decay", "tagger", "untagger", "disown", "spawner"}},
        {.name = "move", .kind = KEEL_SYSTEM_QUERY, .each_chunk = move_fn, .user = a,
         .query = {.with = {a->pos, a->cache}}, .access = {.writes = {a->pos, a->cache}}},
        {.name = "decay", .kind = KEEL_SYSTEM_QUERY, .each_chunk = decay_fn, .user = a,
         .query = {.with = {a->hp, a->bits}}, .access = {.writes = {a->hp, a->bits}}},
        {.name = "tagger", .phase = 1, .kind = KEEL_SYSTEM_QUERY, .each_chunk = tagger_fn, .user = a,
         .query = {.with = {a->pos}, .without = {a->marked}}, .access = {.reads = {a->pos}}},
        {.name = "untagger", .phase = 1, .kind = KEEL_SYSTEM_QUERY, .each_chunk = remove_fn, .user = &untag,
         .query = {.with = {a->pos, a->marked}}, .access = {.reads = {a->pos, a->marked}}},
        {.name = "disown", .phase = 1, .kind = KEEL_SYSTEM_QUERY, .each_chunk = remove_fn, .user = &disown,
         .query = {.with = {a->owner}}, .access = {.reads = {a->owner}}},
        {.name = "spawner", .phase = 2, .kind = KEEL_SYSTEM_CALLBACK, .run = spawner, .user = a},
    };
    for (size_t i = 0; !rc && i < sizeof sys / sizeof sys[0]; i++)
        rc = keel_schedule_add_system(s, &sys[i], NULL);
    if (!rc)
        rc = keel_schedule_build(s);
    if (!rc)
        rc = keel_runtime_set_schedule(a->rt, s);
    else
        keel_schedule_destroy(s);
    if (rc)
        die("building the schedule", rc);
    keel_recovery info;
    if ((rc = keel_runtime_recover(a->rt, &info)))
        die("keel_runtime_recover", rc);
}

/* Run until tick `until`, with a DEFERRED deposit before the second tick of
 * the run and a checkpoint after tick `ckpt` (0: none). */
static void run(app *a, uint64_t until, uint64_t ckpt)
{
    bool deposited = false;
    int rc;
    while (keel_runtime_tick(a->rt) < until) {
        keel_ticket *tk = NULL;
        if (!deposited && keel_runtime_tick(a->rt) % 2 == 1) {
            if ((rc = keel_submit(a->rt, deposit, a, KEEL_DURABLE_DEFERRED, &tk)))
                die("keel_submit", rc);
            deposited = true;
        }
        if ((rc = keel_runtime_step(a->rt)))
            die("keel_runtime_step", rc);
        if (tk) {
            keel_flush(a->rt);
            if ((rc = keel_ticket_wait(tk, -1)))
                die("the deposit", rc);
            keel_ticket_release(tk);
        }
        if (keel_runtime_tick(a->rt) == ckpt && (rc = keel_checkpoint(a->rt)))
            die("keel_checkpoint", rc);
    }
    if ((rc = keel_flush(a->rt)))
        die("keel_flush", rc);
    keel_runtime_close(a->rt);
}

/* ---- harvesting the directory -------------------------------------------------- */

/* Records kept per kind for record/: the first ones, then one compressed. */
#define KEEP_PER_KIND 2

typedef struct harvest {
    unsigned kept[32], zstd_kept[32];
} harvest;

static kw_codec_ctx *raw_codec, *edge_codec;

static void name_record(char *name, size_t size, const char *prefix, const void *key, size_t klen, const kw_header *h,
                        const char *suffix)
{
    int n = snprintf(name, size, "%s-%s-", prefix, kw_kind_name(h->kind));
    if (key)
        for (size_t i = 0; i < klen && i < 16; i++)
            n += snprintf(name + n, size - (size_t)n, "%02x", ((const unsigned char *)key)[i]);
    else
        n += snprintf(name + n, size - (size_t)n, "lsn%llu", (unsigned long long)h->lsn);
    snprintf(name + n, size - (size_t)n, "%s", suffix);
}

static void keep_raw(const char *prefix, const void *key, size_t klen, const void *rec, const kw_header *h)
{
    const void *p;
    kw_buf raw = {0};
    int rc = kw_record_payload(raw_codec, rec, h, &p);
    if (rc || (rc = kw_record_build(raw_codec, &raw, h->kind, h->lsn, h->tick, h->flags, p, h->raw_len)))
        die("rebuilding a record raw", rc);
    char name[128];
    name_record(name, sizeof name, prefix, key, klen, h, "-raw");
    write_file("record", name, raw.p, raw.len);
    kw_buf_free(&raw);
}

static void keep_record(harvest *hv, const char *prefix, const void *key, size_t klen, const void *rec, size_t len)
{
    kw_header h;
    if (kw_record_check(rec, len, &h))
        die("a record of the real directory is invalid", KEEL_ECORRUPT);
    bool z = h.codec != KW_CODEC_RAW;
    unsigned k = h.kind & 31;
    if (hv->kept[k] >= KEEP_PER_KIND && !(z && !hv->zstd_kept[k]))
        return;
    /* named by where it was: a rerun rewrites the same files */
    char name[128];
    name_record(name, sizeof name, prefix, key, klen, &h, z ? "-zstd" : "");
    if (!write_file("record", name, rec, len))
        return;
    hv->kept[k]++;
    hv->zstd_kept[k] += z;
    if (z) /* its payload raw as well: mutations of a raw payload reach the decoders */
        keep_raw(prefix, key, klen, rec, &h);
}

/* The stored schema must begin with fz_corpus_schema(), byte for byte:
 * the fuzz targets decode the corpus against it. */
static void check_schema(const void *rec, size_t len)
{
    kw_codec_ctx *c;
    kw_header h;
    const void *p;
    kw_schema s;
    int rc = kw_codec_create(NULL, &c);
    if (rc || (rc = kw_record_check(rec, len, &h)) || (rc = kw_record_payload(c, rec, &h, &p)) ||
        (rc = kw_schema_decode(p, h.raw_len, &s)))
        die("decoding the stored schema", rc);
    const kw_schema *want = fz_corpus_schema();
    kw_schema head = {want->ncomps, s.comps};
    kw_buf a = {0}, b = {0};
    if (s.ncomps < want->ncomps || kw_schema_encode(&head, &a) || kw_schema_encode(want, &b) || a.len != b.len ||
        memcmp(a.p, b.p, a.len)) {
        fprintf(stderr, "make_corpus: the registered components differ from fz_corpus_schema() (fuzz_common.c)\n");
        exit(1);
    }
    kw_buf_free(&a);
    kw_buf_free(&b);
    kw_schema_free(&s);
    kw_codec_destroy(c);
}

/* fuzz_reader's entry: tag, u32 length, bytes. */
static void entry(kw_buf *b, uint8_t tag, const void *key, size_t klen, const void *val, size_t vlen)
{
    size_t len = vlen + (key ? 1 + klen : 0);
    unsigned char kl = (unsigned char)klen;
    if (kw_put_u8(b, tag) || kw_put_u32(b, (uint32_t)len) || (key && (kw_put_u8(b, kl) || kw_put_bytes(b, key, klen))) ||
        kw_put_bytes(b, val, vlen))
        die("out of memory", KEEL_ENOMEM);
}

/* Serialize the directory for reader/ and keep some of its records. */
static void harvest_dir(const char *dir, const char *name, harvest *hv)
{
    kw_store *s;
    kw_rtxn *r;
    int rc = kw_store_open(dir, &(kw_store_desc){.flags = KW_OPEN_READONLY}, &s);
    if (rc || (rc = kw_read_begin(s, &r)))
        die("opening the directory", rc);
    kw_buf img = {0};
    const void *val, *key;
    size_t vlen, klen;
    if (!kw_get(r, KW_DB_SCHEMA, KW_SCHEMA_KEY, strlen(KW_SCHEMA_KEY), &val, &vlen)) {
        entry(&img, 7, NULL, 0, val, vlen);
        check_schema(val, vlen);
        keep_record(hv, name, KW_SCHEMA_KEY, strlen(KW_SCHEMA_KEY), val, vlen);
    }
    if (!kw_get(r, KW_DB_META, KW_META_CHECKPOINT, strlen(KW_META_CHECKPOINT), &val, &vlen))
        entry(&img, 6, NULL, 0, val, vlen);
    kw_walit *it;
    if ((rc = kw_db_iter(r, KW_DB_SNAP, NULL, 0, &it)))
        die("kw_db_iter", rc);
    while ((rc = kw_db_next(it, &key, &klen, &val, &vlen)) == 1) {
        entry(&img, 3, key, klen, val, vlen);
        keep_record(hv, name, key, klen, val, vlen);
    }
    kw_wal_iter_end(it);
    uint64_t lsn;
    if (rc || (rc = kw_wal_iter(r, 0, &it)))
        die("reading snap", rc);
    while ((rc = kw_wal_next(it, &lsn, &val, &vlen)) == 1) {
        entry(&img, 8, NULL, 0, val, vlen); /* tag 0 + bit 3: keyed by the header's LSN */
        keep_record(hv, name, NULL, 0, val, vlen);
    }
    kw_wal_iter_end(it);
    if (rc)
        die("reading the WAL", rc);
    write_file("reader", name, img.p, img.len);
    kw_buf_free(&img);
    kw_read_end(r);
    kw_store_close(s);
}

/* ---- hand-made edge cases ---------------------------------------------------- */

static void edge_record(const char *name, uint32_t kind, uint64_t lsn, uint64_t tick, uint32_t flags, const kw_buf *pl,
                        kw_buf *keep)
{
    kw_buf rec = {0};
    int rc = kw_record_build(edge_codec, &rec, kind, lsn, tick, flags, pl ? pl->p : NULL, pl ? pl->len : 0);
    if (rc)
        die("kw_record_build", rc);
    if (name)
        write_file("record", name, rec.p, rec.len);
    if (keep)
        *keep = rec;
    else
        kw_buf_free(&rec);
}

/* Set a record's lengths and recompute its CRC (docs/wal-format.md). */
static void seal_by_hand(unsigned char *rec, uint32_t raw_len, uint32_t stored_len)
{
    for (int i = 0; i < 4; i++) {
        rec[32 + i] = (unsigned char)(raw_len >> (8 * i));
        rec[36 + i] = (unsigned char)(stored_len >> (8 * i));
        rec[40 + i] = 0;
    }
    uint32_t crc = kw_crc32c(kw_crc32c(0, rec + KW_HEADER_SIZE, stored_len), rec, KW_HEADER_SIZE);
    for (int i = 0; i < 4; i++)
        rec[40 + i] = (unsigned char)(crc >> (8 * i));
}

static void put_or_die(int rc)
{
    if (rc)
        die("out of memory", rc);
}

static void edge_records(void)
{
    kw_buf pl = {0}, rec;
    write_file("record", "edge-empty", "", 0);
    put_or_die(kw_put_u32(&pl, 2) || kw_put_u32(&pl, 30) || kw_put_u32(&pl, 33) || kw_put_u32(&pl, 0));
    edge_record("edge-commit-hook", KW_KIND_TICK_COMMIT, 3, 1, KW_FLAG_HOOK, &pl, &rec);
    write_file("record", "edge-short-header", rec.p, KW_HEADER_SIZE - 1);
    rec.p[40] ^= 1;
    write_file("record", "edge-bad-crc", rec.p, rec.len);
    kw_buf_free(&rec);
    edge_record("edge-commit-empty-payload", KW_KIND_TICK_COMMIT, 4, 1, 0, NULL, NULL);

    /* LIFECYCLE: every op, a spawn without components, tags with no value */
    pos2 p = {1, 2};
    keel_entity who = KEEL_ENTITY_MAKE(1, 1);
    char label[16] = "edge";
    const uint32_t comps[] = {1, 4, 5}, sizes[] = {8, 16, 0};
    const void *values[] = {&p, label, NULL};
    fz_change ops[] = {
        {.op = KW_OP_SPAWN, .entity = KEEL_ENTITY_MAKE(9, 1), .n = 0},
        {.op = KW_OP_SPAWN, .entity = KEEL_ENTITY_MAKE(10, 1), .n = 3, .comps = comps, .sizes = sizes, .values = values},
        {.op = KW_OP_ADD, .entity = KEEL_ENTITY_MAKE(10, 1), .component = 5},
        {.op = KW_OP_ADD, .entity = KEEL_ENTITY_MAKE(10, 1), .component = 7, .size = 8, .value = &who},
        {.op = KW_OP_REMOVE, .entity = KEEL_ENTITY_MAKE(10, 1), .component = 7},
        {.op = KW_OP_DESTROY, .entity = KEEL_ENTITY_MAKE(9, 1)},
    };
    pl.len = 0;
    fz_encode(&pl, KW_KIND_LIFECYCLE, 0, 0, ops, sizeof ops / sizeof ops[0]);
    edge_record("edge-lifecycle-every-op", KW_KIND_LIFECYCLE, 5, 2, 0, &pl, NULL);

    /* SIDE: a tag write and a value write, DEFERRED */
    wallet wl = {-5, 77};
    fz_change side[] = {{.entity = KEEL_ENTITY_MAKE(2, 1), .component = 5},
                        {.entity = KEEL_ENTITY_MAKE(2, 1), .component = 6, .size = 16, .value = &wl}};
    pl.len = 0;
    fz_encode(&pl, KW_KIND_SIDE, 42, 3, side, 2);
    edge_record("edge-side-tag-and-value", KW_KIND_SIDE, 6, 2, 0, &pl, NULL);
    edge_record("edge-side-max-lsn", KW_KIND_SIDE, UINT64_MAX, UINT64_MAX, 0, &pl, NULL);

    /* SIDES: that transaction, then a keyed one that wrote nothing */
    kw_buf sides = {0}, keyed = {0};
    uint32_t kflags = 0;
    put_or_die(kw_sides_begin(&sides) || kw_sides_put(&sides, 0, pl.p, pl.len) || kw_side_begin(&keyed, 43, 1, 0) ||
               kw_side_end(&keyed, 0x5eed, &kflags) || kw_sides_put(&sides, kflags, keyed.p, keyed.len));
    kw_sides_end(&sides, 2);
    edge_record("edge-sides-two-one-keyed", KW_KIND_SIDES, 7, 2, 0, &sides, NULL);
    kw_buf_free(&sides);
    kw_buf_free(&keyed);

    /* TICK_CHUNK: an empty group between two groups of one component */
    pl.len = 0;
    put_or_die(kw_put_u32(&pl, 3) || kw_put_u32(&pl, 1) || kw_put_u32(&pl, 8) || kw_put_u32(&pl, 1) ||
               kw_put_u64(&pl, KEEL_ENTITY_MAKE(3, 1)) || kw_put_bytes(&pl, &p, 8) || kw_put_u32(&pl, 2) ||
               kw_put_u32(&pl, 4) || kw_put_u32(&pl, 0) || kw_put_u32(&pl, 1) || kw_put_u32(&pl, 8) ||
               kw_put_u32(&pl, 1) || kw_put_u64(&pl, KEEL_ENTITY_MAKE(4, 1)) || kw_put_bytes(&pl, &p, 8));
    edge_record("edge-tick-chunk-empty-group", KW_KIND_TICK_CHUNK, 7, 3, 0, &pl, NULL);

    /* TICK_CHUNK of 200 equal rows: compresses, as its planar form (codec
     * 2) by default and as it is (codec 1) with a plain context */
    fz_change rows[200];
    for (unsigned i = 0; i < 200; i++)
        rows[i] = (fz_change){.entity = KEEL_ENTITY_MAKE(i, 1), .component = 1, .size = 8, .value = &p};
    pl.len = 0;
    fz_encode(&pl, KW_KIND_TICK_CHUNK, 0, 0, rows, 200);
    edge_record("edge-tick-chunk-planar", KW_KIND_TICK_CHUNK, 8, 3, 0, &pl, &rec);
    kw_codec_ctx *plain;
    int prc = kw_codec_create(&(kw_codec_desc){.plain = true}, &plain);
    if (prc)
        die("kw_codec_create", prc);
    kw_buf zrec = {0};
    if ((prc = kw_record_build(plain, &zrec, KW_KIND_TICK_CHUNK, 8, 3, 0, pl.p, pl.len)))
        die("kw_record_build", prc);
    write_file("record", "edge-tick-chunk-zstd", zrec.p, zrec.len);
    kw_codec_destroy(plain);
    /* a zstd-planar record whose planar form does not parse (the group
     * claims 201 rows), with a valid frame and CRC: refused at read */
    pl.p[12] = 201;
    size_t z = ZSTD_compress(zrec.p + KW_HEADER_SIZE, zrec.cap - KW_HEADER_SIZE, pl.p, pl.len, 1);
    if (ZSTD_isError(z))
        die("ZSTD_compress", KEEL_EINVAL);
    zrec.p[7] = KW_CODEC_ZSTD_PLANAR;
    seal_by_hand(zrec.p, (uint32_t)pl.len, (uint32_t)z);
    write_file("record", "edge-planar-group-overruns", zrec.p, KW_HEADER_SIZE + z);
    /* codec 2 on a side record: refused by the header check */
    rec.p[6] = KW_KIND_SIDE;
    seal_by_hand(rec.p, (uint32_t)pl.len, (uint32_t)(rec.len - KW_HEADER_SIZE));
    write_file("record", "edge-planar-on-side", rec.p, rec.len);
    kw_buf_free(&zrec);
    kw_buf_free(&rec);

    /* SCHEMA at the limits: 64 fields with 63-byte names, a 63-byte component name, a tag */
    kw_field fields[64];
    for (unsigned i = 0; i < 64; i++) {
        fields[i] = (kw_field){.type = 1, .offset = i, .count = 1};
        memset(fields[i].name, 'a' + i % 26, 63);
        fields[i].name[63] = 0;
        fields[i].name[0] = (char)('0' + i % 10);
    }
    kw_component kc[3] = {{.id = 1, .size = 64, .align = 1, .nfields = 64, .fields = fields},
                          {.id = 2, .align = 1, .discipline = 2},
                          {.id = 3, .size = 8, .align = 8, .discipline = 1, .nfields = 1, .fields = fields}};
    snprintf(kc[0].name, sizeof kc[0].name, "wide");
    memset(kc[1].name, 'n', 63);
    snprintf(kc[2].name, sizeof kc[2].name, "one");
    pl.len = 0;
    put_or_die(kw_schema_encode(&(kw_schema){3, kc}, &pl));
    edge_record("edge-schema-limits", KW_KIND_SCHEMA, 9, 0, 0, &pl, NULL);

    /* a field past its value: kw_schema_decode refuses it (a fuzz_record finding) */
    kw_field past = {.type = 4, .offset = 8, .count = 1};
    snprintf(past.name, sizeof past.name, "past");
    kw_component pc = {.id = 1, .size = 8, .align = 8, .nfields = 1, .fields = &past};
    snprintf(pc.name, sizeof pc.name, "pos");
    pl.len = 0;
    put_or_die(kw_schema_encode(&(kw_schema){1, &pc}, &pl));
    edge_record("edge-schema-field-past-the-value", KW_KIND_SCHEMA, 10, 0, 0, &pl, NULL);

    /* SNAP_KEYS: two remembered keys; then a key 0, which decoding refuses */
    const uint64_t keys[] = {0x6b65656c, UINT64_MAX}, ticks[] = {7, 9};
    pl.len = 0;
    put_or_die(kw_snap_keys_encode(&pl, 2, keys, ticks));
    edge_record("edge-snap-keys", KW_KIND_SNAP_KEYS, 0, 9, 0, &pl, NULL);
    memset(pl.p, 0, 8);
    edge_record("edge-snap-keys-zero-key", KW_KIND_SNAP_KEYS, 0, 9, 0, &pl, NULL);

    /* a zstd frame of 13 bytes declaring 2 GiB - 1, with a valid CRC (the
     * fuzz_record finding, made by hand): refused before any allocation */
    static const unsigned char frame[] = {0x28, 0xb5, 0x2f, 0xfd, 0xa0, 0xff, 0xff, 0xff, 0x7f, 0x83, 0x00, 0x00, 0x41};
    pl.len = 0;
    put_or_die(kw_put_u8(&pl, 0));
    edge_record(NULL, KW_KIND_SIDE, 11, 1, 0, &pl, &rec);
    rec.len = KW_HEADER_SIZE;
    put_or_die(kw_put_bytes(&rec, frame, sizeof frame));
    rec.p[7] = KW_CODEC_ZSTD;
    seal_by_hand(rec.p, 0x7fffffffu, sizeof frame);
    write_file("record", "edge-zstd-claims-2gib", rec.p, rec.len);
    kw_buf_free(&rec);

    unsigned char meta[32];
    kw_checkpoint_meta_encode(&(kw_checkpoint_meta){.tick = 4, .lsn = 40, .created_ns = 123456789, .count = 2}, meta);
    write_file("record", "edge-checkpoint-pointer", meta, sizeof meta);
    kw_buf_free(&pl);
}

static void edge_dirs(void)
{
    kw_buf img = {0}, pl = {0}, r1, r2, r3;
    write_file("reader", "edge-empty", "", 0);

    put_or_die(kw_put_u32(&pl, 0) || kw_put_u32(&pl, 0) || kw_put_u32(&pl, 0) || kw_put_u32(&pl, 0));
    edge_record(NULL, KW_KIND_TICK_COMMIT, 1, 1, 0, &pl, &r1);
    edge_record(NULL, KW_KIND_TICK_COMMIT, 2, 2, 0, &pl, &r2);
    edge_record(NULL, KW_KIND_TICK_COMMIT, 5, 3, 0, &pl, &r3);
    /* keys that are not LSNs: 3 bytes, and 9 bytes sorting between LSN 1 and 2 */
    entry(&img, 8, NULL, 0, r1.p, r1.len);
    entry(&img, 8, NULL, 0, r2.p, r2.len);
    entry(&img, 5, "abc", 3, r3.p, r3.len);
    entry(&img, 5, "\0\0\0\0\0\0\0\1x", 9, r3.p, r3.len);
    entry(&img, 3, "T", 1, r1.p, r1.len); /* a snap key holding a WAL record */
    write_file("reader", "edge-raw-keys", img.p, img.len);

    img.len = 0;
    entry(&img, 0, NULL, 0, r3.p, r3.len);    /* key 1, header LSN 5 */
    entry(&img, 0x20, NULL, 0, r1.p, r1.len); /* key 4 (gap 2), header LSN 1 */
    entry(&img, 8, NULL, 0, r3.p, r3.len);    /* key 5 = its header */
    entry(&img, 0, NULL, 0, r2.p, r2.len - 1); /* key 6, one byte short */
    write_file("reader", "edge-gaps-and-mismatches", img.p, img.len);

    img.len = 0;
    entry(&img, 1, "format", 6, "\2\0\0\0", 4);
    entry(&img, 8, NULL, 0, r1.p, r1.len);
    write_file("reader", "edge-format-2", img.p, img.len);

    img.len = 0;
    unsigned char meta[32] = {0};
    entry(&img, 6, NULL, 0, meta, 31);        /* a checkpoint pointer one byte short */
    entry(&img, 7, NULL, 0, r1.p, r1.len);    /* "components" holding a commit marker */
    entry(&img, 4, "d", 1, "dictionary", 10); /* dict is empty in format 1 */
    write_file("reader", "edge-bad-meta-and-schema", img.p, img.len);

    kw_buf_free(&img);
    kw_buf_free(&pl);
    kw_buf_free(&r1);
    kw_buf_free(&r2);
    kw_buf_free(&r3);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUTDIR   (writes OUTDIR/record and OUTDIR/reader)\n", argv[0]);
        return 2;
    }
    out_dir = argv[1];
    char sub[1024];
    mkdir(out_dir, 0755);
    snprintf(sub, sizeof sub, "%s/record", out_dir);
    mkdir(sub, 0755);
    snprintf(sub, sizeof sub, "%s/reader", out_dir);
    mkdir(sub, 0755);
    char dir[] = "/tmp/keel-make-corpus-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char data[64];
    snprintf(data, sizeof data, "%s/data", dir);

    int rc = kw_codec_create(NULL, &edge_codec);
    if (rc || (rc = kw_codec_create(&(kw_codec_desc){.min_compress = UINT32_MAX}, &raw_codec)))
        die("kw_codec_create", rc);
    app a = {0};
    harvest hv = {0};
    app_open(&a, data, false, true);
    run(&a, 4, 3);
    harvest_dir(data, "run1", &hv);
    app_open(&a, data, true, false);
    run(&a, 6, 6);
    harvest_dir(data, "run2", &hv);
    nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);

    edge_records();
    edge_dirs();
    kw_codec_destroy(edge_codec);
    kw_codec_destroy(raw_codec);
    printf("make_corpus: %lu files, %lu bytes in %s\n", files_written, bytes_written, out_dir);
    return 0;
}
