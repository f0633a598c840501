/*
 * keel/failpoint.h -- named failpoints: break the runtime on purpose at a
 * chosen instant, to prove that recovery holds (docs/testing.md lists every
 * point, the instant it models and the actions it takes).
 *
 * A failpoint is a named place in the runtime or the WAL library, such as
 * `wal.before_commit` or `ckpt.before_meta`. Armed, it can kill the process
 * (SIGKILL, as a crash would), make the operation it guards fail with EIO or
 * ENOSPC (only at the points that guard I/O), or sleep. Disarmed it costs one
 * relaxed atomic load; built with -DKEEL_FAILPOINTS=OFF it costs nothing.
 *
 * Configuration: the environment variable KEEL_FAILPOINTS, read once, at the
 * first keel_runtime_create, keel_failpoints_set or kw_store_backup of the
 * process, or keel_failpoints_set. Syntax:
 *
 *   spec   := item (';' item)*
 *   item   := name '=' action ['@' N]     N: only the N-th hit fires (1-based)
 *   action := crash | eio | enospc | delay:<ms>
 *
 * e.g. KEEL_FAILPOINTS="wal.after_commit=crash@3"
 *      KEEL_FAILPOINTS="wal.before_commit=eio@5; fence.after_compress=delay:2"
 * Hits are counted per point from the moment it is armed.
 */
#ifndef KEEL_FAILPOINT_H
#define KEEL_FAILPOINT_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The i-th compiled-in failpoint name (i from 0), NULL past the end (and
 * always NULL when failpoints are compiled out). Static storage. */
const char *keel_failpoint_name(size_t i);

/* Replace the whole failpoint configuration by spec (the syntax above; ""
 * or NULL disarms every point). Whitespace around names, actions and
 * numbers is ignored, and so are empty items. All or nothing: on error the
 * configuration is unchanged. Errors: KEEL_EINVAL (an unknown name, an
 * unknown action, eio/enospc at a point that guards no I/O, a bad number,
 * a point named twice, failpoints compiled out), with keel_last_error()
 * naming the item. The first call also reads KEEL_FAILPOINTS, which it then
 * replaces. Thread-safe. */
int keel_failpoints_set(const char *spec);

/* false when the library was built with -DKEEL_FAILPOINTS=OFF. */
bool keel_failpoints_compiled(void);

#ifdef __cplusplus
}
#endif
#endif
