/*
 * wal/reader.c -- filtered scans of the WAL for recovery checks and the
 * tools: LSN and tick bounds, kinds, every returned record checked.
 */
#include <stdlib.h>

#include "core/core.h"
#include "keel_wal/wal.h"

struct kw_scan {
    kw_walit *it;
    kw_range range;
};

int kw_scan_begin(kw_rtxn *r, const kw_range *range, kw_scan **out)
{
    kw_scan *s = calloc(1, sizeof *s);
    if (!s)
        return core_fail(KEEL_ENOMEM, "out of memory for a WAL scan");
    s->range = range ? *range : (kw_range){0};
    int rc = kw_wal_iter(r, s->range.from_lsn, &s->it);
    if (rc) {
        free(s);
        return rc;
    }
    *out = s;
    return KEEL_OK;
}

/* A record that fails its check is named by its key: the header may be too
 * short or too damaged to hold an LSN (FRAME), or claim another one. */
static int refuse(uint64_t lsn, const kw_header *h, kw_fault fault, int rc)
{
    if (fault != KW_FAULT_FRAME && h->lsn == lsn)
        return rc; /* the sentence names it already */
    return core_fail_prefix(rc, "WAL record at LSN %llu", (unsigned long long)lsn);
}

int kw_scan_next(kw_scan *s, kw_record *out)
{
    const kw_range *g = &s->range;
    for (;;) {
        int rc = kw_wal_next(s->it, &out->lsn, &out->rec, &out->len);
        if (rc <= 0)
            return rc;
        if (g->to_lsn && out->lsn > g->to_lsn)
            return 0;
        kw_fault fault;
        if ((rc = kw_record_verify(out->rec, out->len, &out->h, &fault)))
            return refuse(out->lsn, &out->h, fault, rc);
        if (out->h.lsn != out->lsn)
            return core_fail(KEEL_ECORRUPT, "WAL record at LSN %llu: its header says LSN %llu",
                             (unsigned long long)out->lsn, (unsigned long long)out->h.lsn);
        if (out->h.tick < g->from_tick || (g->to_tick && out->h.tick > g->to_tick))
            continue;
        if (g->kinds && !(out->h.kind < 32 && (g->kinds >> out->h.kind) & 1))
            continue;
        return 1;
    }
}

void kw_scan_end(kw_scan *s)
{
    if (!s)
        return;
    kw_wal_iter_end(s->it);
    free(s);
}

bool kw_out_of_memory_seen(void)
{
    return core_out_of_memory_seen();
}
