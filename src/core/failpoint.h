/*
 * core/failpoint.h -- the named failpoints (keel/failpoint.h is the public
 * side; docs/testing.md lists the instants they model).
 *
 * A call site reads
 *
 *     int rc = KEEL_FAILPOINT(WAL_BEFORE_COMMIT);   // I/O point: 0 or KEEL_EIO / KEEL_ENOSPC
 *     (void)KEEL_FAILPOINT(FENCE_AFTER_PREP);       // other points: crash or delay only
 *
 * The list lives here, in one place, so the names, the ids and whether a
 * point guards I/O cannot disagree. An I/O point is placed right before the
 * operation it guards: eio / enospc there make that operation fail with
 * the code (and keel_last_error() naming the failpoint), and the caller
 * takes its real error path. A crash or a delay happens at the same instant
 * at every point.
 *
 * Memory ordering. The fast path is one relaxed load of core_fp_armed[id];
 * only when it reads non-zero does core_fp_fire take the failpoint mutex,
 * under which the configuration (action, N, hit count) is read and the hit
 * counted. keel_failpoints_set writes the configuration and the armed flags
 * under the same mutex. Nothing but the mutex orders the configuration, so
 * the flag needs no acquire/release: a hit that happens after a set call
 * (program order, or any synchronisation such as thread creation) sees the
 * new flag by coherence; a hit racing with a set call may see either flag,
 * and if it sees a stale non-zero one it finds the point disarmed under the
 * mutex and does nothing.
 */
#ifndef KEEL_CORE_FAILPOINT_H
#define KEEL_CORE_FAILPOINT_H

#include <stdatomic.h>
#include <stdint.h>

#include "core/core.h"
#include "keel/failpoint.h"

/* X(id, name, io): io = 1 when the point guards an I/O operation (eio and
 * enospc apply there). Order = keel_failpoint_name order. */
#define CORE_FAILPOINT_LIST(X)                          \
    X(WAL_PUT, "wal.put", 1)                            \
    X(WAL_BEFORE_COMMIT, "wal.before_commit", 1)        \
    X(WAL_AFTER_COMMIT, "wal.after_commit", 0)          \
    X(FENCE_AFTER_PREP, "fence.after_prep", 0)          \
    X(FENCE_AFTER_COMPRESS, "fence.after_compress", 0)  \
    X(FENCE_BEFORE_ENQUEUE, "fence.before_enqueue", 0)  \
    X(CKPT_AFTER_CAPTURE, "ckpt.after_capture", 0)      \
    X(CKPT_AFTER_SERIALIZE, "ckpt.after_serialize", 0)  \
    X(CKPT_BEFORE_META, "ckpt.before_meta", 1)          \
    X(CKPT_BEFORE_WAL_DELETE, "ckpt.before_wal_delete", 1) \
    X(CKPT_AFTER_COMMIT, "ckpt.after_commit", 0)        \
    X(RECOVER_BEFORE_REPLAY, "recover.before_replay", 0) \
    X(RECOVER_MID_REPLAY, "recover.mid_replay", 0)      \
    X(RECOVER_AFTER_REPLAY, "recover.after_replay", 0)  \
    X(SIDE_BEFORE_ENQUEUE, "side.before_enqueue", 0)    \
    X(SIDE_BEFORE_WAIT, "side.before_wait", 0)          \
    X(BACKUP_CLAIM, "backup.claim", 1)                  \
    X(BACKUP_COPY, "backup.copy", 1)

typedef enum core_fp {
#define CORE_FP_ENUM_(id, name, io) CORE_FP_##id,
    CORE_FAILPOINT_LIST(CORE_FP_ENUM_)
#undef CORE_FP_ENUM_
    CORE_FP_COUNT_
} core_fp;

#ifdef KEEL_HAVE_FAILPOINTS
extern _Atomic uint32_t core_fp_armed[CORE_FP_COUNT_];
/* The slow path of an armed point: count the hit, act when it fires.
 * Returns 0, or KEEL_EIO / KEEL_ENOSPC (last error set); never returns
 * after a crash. */
int core_fp_fire(core_fp id);
#define KEEL_FAILPOINT(p)                                                                      \
    (CORE_UNLIKELY(atomic_load_explicit(&core_fp_armed[CORE_FP_##p], memory_order_relaxed)) \
         ? core_fp_fire(CORE_FP_##p)                                                          \
         : 0)
#else
/* compiled out: still checks that the point exists */
#define KEEL_FAILPOINT(p) ((void)CORE_FP_##p, 0)
#endif

/* Read KEEL_FAILPOINTS once per process (keel_runtime_create calls it; so
 * do the first keel_failpoints_set and kw_store_backup). A bad value prints one warning line
 * on stderr and is ignored. */
void core_fp_env_init(void);

/* Test hook: fn(name, action, hit, arg) runs in the hitting thread right
 * before a point acts (before the SIGKILL of a crash), so a test can record
 * that the point was reached. action is "crash", "eio", "enospc" or
 * "delay". NULL removes it. */
typedef void (*core_fp_observer)(const char *name, const char *action, uint64_t hit, void *arg);
void core_fp_set_observer(core_fp_observer fn, void *arg);

#endif
