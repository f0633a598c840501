/*
 * tools/bench/bench_util.c -- reporting (figure lines, JSON objects, the
 * summary table), the side-by-side runner, utilities and data directories
 * shared by the keel-bench files.
 */
#include <dirent.h>
#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

volatile float g_dt = 1.0f / 60.0f;
volatile double g_sink;

/* ---- utilities ------------------------------------------------------------ */

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "keel-bench: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

void check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "keel-bench: %s failed: %s: %s\n", what, keel_strerror(rc), keel_last_error());
        exit(1);
    }
}

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double median(double *v, uint32_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint32_t pow2_at_least(uint32_t n)
{
    uint32_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

keel_component register_vec3(keel_world *w, const char *name)
{
    static const keel_field fields[3] = {
        { .name = "x", .type = KEEL_F32, .offset = 0 },
        { .name = "y", .type = KEEL_F32, .offset = 4 },
        { .name = "z", .type = KEEL_F32, .offset = 8 },
    };
    keel_component_desc desc = {
        .name = name, .size = sizeof(vec3), .fields = fields, .field_count = 3,
    };
    keel_component c;
    check(keel_component_register(w, &desc, &c), "keel_component_register");
    return c;
}

double process_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double percentile(double *v, size_t n, double p)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    double rank = p * (double)n;   /* ceil without libm: the tools are not linked with -lm */
    size_t k = (size_t)rank;
    k += (double)k < rank;
    return v[k ? (k > n ? n : k) - 1 : 0];
}

/* A fresh directory under $TMPDIR (default /tmp) for a data directory. */
char *make_tmpdir(const char *tag)
{
    const char *base = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/keel-bench-%s-XXXXXX", base && *base ? base : "/tmp", tag);
    if (!mkdtemp(path)) {
        fprintf(stderr, "keel-bench: mkdtemp %s: %s\n", path, strerror(errno));
        exit(1);
    }
    char *dir = xmalloc(strlen(path) + 1);
    strcpy(dir, path);
    return dir;
}

/* Remove a data directory (LMDB keeps flat files in it) and free the name. */
void remove_tmpdir(char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[1024];
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (unlink(path) != 0)
                fprintf(stderr, "keel-bench: cannot remove %s: %s\n", path, strerror(errno));
        }
        closedir(d);
    }
    if (rmdir(dir) != 0)
        fprintf(stderr, "keel-bench: cannot remove %s: %s\n", dir, strerror(errno));
    free(dir);
}

/* Copy the flat files of data directory `from` into `to` (the copy of a
 * closed directory is a valid directory). */
void copy_tmpdir(const char *from, const char *to)
{
    DIR *d = opendir(from);
    if (!d) {
        fprintf(stderr, "keel-bench: opendir %s: %s\n", from, strerror(errno));
        exit(1);
    }
    struct dirent *e;
    static char buf[1 << 20];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char a[1024], b[1024];
        snprintf(a, sizeof a, "%s/%s", from, e->d_name);
        snprintf(b, sizeof b, "%s/%s", to, e->d_name);
        FILE *in = fopen(a, "rb"), *out = fopen(b, "wb");
        if (!in || !out) {
            fprintf(stderr, "keel-bench: cannot copy %s to %s: %s\n", a, b, strerror(errno));
            exit(1);
        }
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, in)) > 0)
            if (fwrite(buf, 1, n, out) != n) {
                fprintf(stderr, "keel-bench: cannot write %s: %s\n", b, strerror(errno));
                exit(1);
            }
        fclose(in);
        if (fclose(out) != 0) {
            fprintf(stderr, "keel-bench: cannot write %s: %s\n", b, strerror(errno));
            exit(1);
        }
    }
    closedir(d);
}


/* ---- reporting ------------------------------------------------------------- */

static double figure_ratio(const figure *f)
{
    return f->baseline > 0 ? f->value / f->baseline : NAN;
}

static bool figure_meets(const figure *f)
{
    double x = f->target_on_ratio ? figure_ratio(f) : f->value;
    return isfinite(x) && (f->at_least ? x >= f->target : x <= f->target);
}

/* "key":number, -- or null when it is not a number (a sample set was empty). */
static void json_number(const char *key, double x)
{
    if (isfinite(x))
        printf("\"%s\":%.6g,", key, x);
    else
        printf("\"%s\":null,", key);
}

static void report_json(const figure *f)
{
    double ratio = figure_ratio(f);
    printf("{\"name\":\"%s\",", f->name);
    json_number("value", f->value);
    printf("\"unit\":\"%s\",", f->unit);
    json_number("baseline", f->baseline);
    json_number("ratio", ratio);
    if (f->no_target)
        printf("\"target\":null,\"target_of\":null,\"bound\":null,\"meets\":null}\n");
    else
        printf("\"target\":%g,\"target_of\":\"%s\",\"bound\":\"%s\",\"meets\":%s}\n", f->target,
               f->target_on_ratio ? "ratio" : "value", f->at_least ? "min" : "max", figure_meets(f) ? "true" : "false");
}

/* "ratio >= 0.80x", "<= 100 ns/entity" or "-". */
static void target_text(const figure *f, char *out, size_t len)
{
    const char *op = f->at_least ? ">=" : "<=";
    if (f->no_target)
        snprintf(out, len, "-");
    else if (f->target_on_ratio)
        snprintf(out, len, "ratio %s %.2fx", op, f->target);
    else
        snprintf(out, len, "%s %g %s", op, f->target, f->unit);
}

static const char *verdict(const figure *f)
{
    return f->no_target ? "" : figure_meets(f) ? "ok" : "MISS";
}

static void report_text(const figure *f)
{
    char target[48];
    target_text(f, target, sizeof target);
    printf("%-16s %10.4g %-10s %10.4g %-10s %7.2fx   %-18s %s\n", f->name, f->value, f->unit,
           f->baseline, f->unit, figure_ratio(f), target, verdict(f));
}

/* Every figure reported, for the summary (names copied: some are built in
 * local buffers). */
static figure *g_figures;
static size_t g_nfigures, g_figures_cap;

static void keep_figure(const figure *f)
{
    if (g_nfigures == g_figures_cap) {
        g_figures_cap = g_figures_cap ? 2 * g_figures_cap : 64;
        figure *n = realloc(g_figures, g_figures_cap * sizeof *n);
        if (!n) {
            fprintf(stderr, "keel-bench: out of memory\n");
            exit(1);
        }
        g_figures = n;
    }
    figure *k = &g_figures[g_nfigures++];
    *k = *f;
    char *name = xmalloc(strlen(f->name) + 1);
    strcpy(name, f->name);
    k->name = name;
}

void report(const config *cfg, const figure *f)
{
    if (cfg->json)
        report_json(f);
    else
        report_text(f);
    fflush(stdout);
    keep_figure(f);
}

void note(const config *cfg, const char *fmt, ...)
{
    if (cfg->json)
        return;
    va_list ap;
    va_start(ap, fmt);
    printf("# ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

void report_summary(const config *cfg)
{
    if (cfg->json || !g_nfigures)
        return;
    size_t meet = 0, miss = 0;
    printf("\n# summary: %zu figures (value, baseline, ratio = value / baseline, target)\n", g_nfigures);
    printf("%-22s %12s %12s %-10s %9s  %-20s %s\n", "# figure", "value", "baseline", "unit", "ratio", "target", "");
    for (size_t i = 0; i < g_nfigures; i++) {
        const figure *f = &g_figures[i];
        char target[48];
        target_text(f, target, sizeof target);
        printf("%-22s %12.4g %12.4g %-10s %8.3gx  %-20s %s\n", f->name, f->value, f->baseline, f->unit,
               figure_ratio(f), target, verdict(f));
        meet += !f->no_target && figure_meets(f);
        miss += !f->no_target && !figure_meets(f);
    }
    printf("# %zu meet their target, %zu miss, %zu have none\n", meet, miss, g_nfigures - meet - miss);
    for (size_t i = 0; i < g_nfigures; i++)
        free((char *)g_figures[i].name);
    free(g_figures);
    g_figures = NULL;
    g_nfigures = g_figures_cap = 0;
}

/* ---- side-by-side runner ---------------------------------------------------- */

/* Keep memory a round freed resident for the next round (glibc: no mmap for
 * large blocks, no trimming of the heap top). On the Firecracker VMs these
 * benchmarks run on, the first touch of a fresh page costs ~15 us, so without
 * this every round would re-fault its storage and the spawn and destroy
 * figures would measure the VM's page faults rather than keel; a long-running
 * server reuses a warm heap the same way. Both sides get the same heap. */
void keep_heap_resident(void)
{
#ifdef __GLIBC__
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, -1);
#endif
}

void run_pair(const config *cfg, uint32_t reps, measure_fn baseline, measure_fn subject, void *ctx, figure *f)
{
    keep_heap_resident();
    baseline(ctx);
    subject(ctx);
    double *b = xmalloc(cfg->rounds * sizeof *b);
    double *s = xmalloc(cfg->rounds * sizeof *s);
    for (uint32_t r = 0; r < cfg->rounds; r++) {
        b[r] = s[r] = 0;
        for (uint32_t k = 0; k < reps; k++) {
            if (r % 2 == 0) {
                b[r] += baseline(ctx);
                s[r] += subject(ctx);
            } else {
                s[r] += subject(ctx);
                b[r] += baseline(ctx);
            }
        }
        b[r] /= reps;
        s[r] /= reps;
    }
    f->baseline = median(b, cfg->rounds);
    f->value = median(s, cfg->rounds);
    free(b);
    free(s);
}

void wal_each_payload(kw_store *st, kw_codec_ctx *c, wal_payload_fn fn, void *arg)
{
    kw_rtxn *r;
    kw_walit *it;
    check(kw_read_begin(st, &r), "kw_read_begin");
    check(kw_wal_iter(r, 0, &it), "kw_wal_iter");
    uint64_t lsn;
    const void *rec, *payload;
    size_t len;
    int rc;
    while ((rc = kw_wal_next(it, &lsn, &rec, &len)) == 1) {
        kw_header h;
        check(kw_record_check(rec, len, &h), "kw_record_check");
        check(kw_record_payload(c, rec, &h, &payload), "kw_record_payload");
        fn(&h, payload, arg);
    }
    check(rc, "kw_wal_next");
    kw_wal_iter_end(it);
    kw_read_end(r);
}
