/*
 * test_util.h -- what the test programs share (tests/test_util.c, the
 * library keel_test_util that tests/CMakeLists.txt links into every
 * program):
 *
 *   time and waiting       the monotonic clock, a rendezvous on an atomic
 *                          counter guarded by a generous deadline, a
 *                          process stopped (SIGSTOP) for certain;
 *   runtimes               a runtime made from a descriptor, a schedule
 *                          built and installed, components registered,
 *                          telemetry and counters read back, a system that
 *                          does nothing, a seeded PRNG;
 *   temporary directories  a mkdtemp base per test case, removed with all
 *                          in it by the case's unchecked fixture;
 *   running a tool         a built binary (keel-wal, keel-world), or a
 *                          function, as a child process, its stdout,
 *                          stderr and exit status captured through pipes;
 *   WAL records on disk    a copy of the record at an LSN, a byte flipped in
 *                          every copy of it in data.mdb, a record put back,
 *                          an error message naming an LSN.
 *
 * Every helper fails the running test (ck_assert) when the file system or
 * a system call does not do what it needs.
 */
#ifndef KEEL_TEST_UTIL_H
#define KEEL_TEST_UTIL_H

#include <check.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "keel/keel.h"
#include "keel_wal/wal.h"

/* ---- time and waiting ---------------------------------------------------------------------- */

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t tu_now_ns(void);

/* Wait (yielding) until *v >= target; false after a (very generous) 30 s
 * deadline. Only a rendezvous guard: it never decides an outcome that a
 * correct runtime could miss. For _Atomic uint32_t and _Atomic uint64_t. */
#define tu_wait_at_least(v, target) \
    _Generic((v), _Atomic uint32_t *: tu_wait_at_least_u32, _Atomic uint64_t *: tu_wait_at_least_u64)((v), (target))
bool tu_wait_at_least_u32(_Atomic uint32_t *v, uint32_t target);
bool tu_wait_at_least_u64(_Atomic uint64_t *v, uint64_t target);

/* How many of this process's threads are named `name` (/proc/self/task). */
int tu_threads_named(const char *name);
/* The thread id of a thread named `name`, or 0. */
pid_t tu_thread_id(const char *name);
/* Poll, up to 5 s, until no thread is named `name` (a joined thread's
 * /proc entry can outlive pthread_join by a moment); whether that happened. */
bool tu_threads_gone(const char *name);
/* SIGSTOP pid and return once every one of its threads has stopped
 * (kill() returns before they do: a running thread goes on for a moment). */
void tu_stop_process(pid_t pid);

/* ---- runtimes -------------------------------------------------------------------------------- */

/* keel_runtime_create(&d) that must succeed (zero fields: the runtime's
 * defaults). With d.workers > 0 the runtime runs exactly that many. */
keel_runtime *tu_rt_new(keel_runtime_desc d);
/* Build s (warnings allowed, an error fails the test after printing every
 * diagnostic) and install it on rt. */
void tu_install(keel_runtime *rt, keel_schedule *s);
/* n keel_runtime_step calls that must succeed. */
void tu_step_n(keel_runtime *rt, uint64_t n);
/* Print every diagnostic of s to stderr. */
void tu_print_diags(const keel_schedule *s);
/* keel_world_create(&d) that must succeed. */
keel_world *tu_world_new(keel_world_desc d);
/* A new command buffer on w. */
keel_cmdbuf *tu_cmdbuf_new(keel_world *w);
/* Apply cb at once (between steps): it must create exactly n entities,
 * whose handles go to out (may be NULL); cb is destroyed. */
void tu_cmdbuf_apply_created(keel_cmdbuf *cb, uint32_t n, keel_entity *out);
/* Destroy e at once (between steps, one apply); it must be gone after. */
void tu_destroy_now(keel_world *w, keel_entity e);
/* Register a component that must get an id (not 0). */
keel_component tu_reg(keel_world *w, const char *name, uint32_t size, keel_discipline disc,
                      const keel_field *fields, uint32_t nfields);
/* A query over entities with c0 and c1 (c1 0: c0 alone). */
keel_query *tu_query_new(keel_world *w, keel_component c0, keel_component c1);
/* The telemetry record of system sys at tick (it must exist). */
keel_system_record tu_sysrec(keel_runtime *rt, uint64_t tick, keel_system sys);
/* The runtime's counters (every field written by keel_runtime_stats_get). */
keel_runtime_stats tu_stats(const keel_runtime *rt);
/* A callback system body that does nothing. */
int tu_sys_noop(keel_ctx *ctx, void *user);
/* splitmix64 on *state: the same sequence for the same seed, everywhere. */
uint64_t tu_rng_next(uint64_t *state);
/* tu_rng_next(state) % n. */
uint32_t tu_rng_below(uint64_t *state, uint32_t n);

/* ---- temporary directories ------------------------------------------------------------- */

/* Unchecked fixture (tcase_add_unchecked_fixture): makes the base directory
 * /tmp/keel-<name>-XXXXXX, <name> being the program's name without "test_"
 * (test_walcli: /tmp/keel-walcli-...). It runs in the runner process, so
 * the teardown removes the base even after a test failed or crashed half
 * way; KEEL_<NAME>_KEEP=1 (KEEL_WALCLI_KEEP=1 ...) keeps it for a look.
 * Directories a test made unreadable are made readable again first. */
void tu_base_setup(void);
void tu_base_teardown(void);
/* A suite `name` of one test case `name` holding the n tests, with the
 * base-directory fixture above and a timeout of `timeout` seconds. */
Suite *tu_suite(const char *name, const TTest *const *tests, size_t n, int timeout);
/* The same with one more unchecked fixture, run after the base directory's
 * (a server the tests share: it may make files under the base). */
Suite *tu_suite_with(const char *name, const TTest *const *tests, size_t n, int timeout, void (*setup)(void),
                     void (*teardown)(void));
/* A suite `suite_name` of one test case `case_name` holding the n tests,
 * with Check's default fixture-less setup and timeout. */
Suite *tu_case_suite(const char *suite_name, const char *case_name, const TTest *const *tests, size_t n);
/* The base directory of the running test case. */
const char *tu_base(void);
/* base/name into out (not created: the runtime creates its own directory). */
void tu_path(char *out, size_t n, const char *name);
/* Remove dir and everything below it; a missing dir is fine. */
void tu_rmtree(const char *dir);
/* Create path holding the n bytes at p. */
void tu_write_file(const char *path, const void *p, size_t n);
/* A file's size and FNV-1a hash of its bytes, to show it was left as it was. */
typedef struct tu_digest {
    uint64_t size, hash;
} tu_digest;
tu_digest tu_file_digest(const char *path);
#define tu_assert_digest_eq(a, b)                                                                         \
    ck_assert_msg((a).size == (b).size && (a).hash == (b).hash, "data.mdb changed: %llu bytes %016llx -> " \
                  "%llu bytes %016llx", (unsigned long long)(a).size, (unsigned long long)(a).hash,         \
                  (unsigned long long)(b).size, (unsigned long long)(b).hash)
/* Copy the file src to dst (created or replaced). */
void tu_copy_file(const char *src, const char *dst);

/* Damage to a data.mdb, as an operator meets it (test_ops, test_walcli, test_demo). Apply it
 * to a compacted copy (kw_store_backup: no free pages), so every page a cut removes is one
 * the trees use. `says` is what the refusal's sentence holds. */
typedef enum tu_damage {
    TU_DAMAGE_EMPTY,
    TU_DAMAGE_PAGE_SHORT,      /* one page short */
    TU_DAMAGE_HALF,            /* half of the file */
    TU_DAMAGE_METAS_ONLY,      /* only the two meta pages */
    TU_DAMAGE_TORN_META0,      /* meta page 0 without LMDB's magic */
    TU_DAMAGE_TORN_META1,
    TU_DAMAGE_LAST_PAST_END,   /* the newest meta's last page 10 pages past the end */
    TU_DAMAGE_ROOT_PAST_LAST,  /* meta page 0's main root past its last page */
    TU_DAMAGE_VERSION,         /* the newest meta says LMDB data version 2 */
    TU_DAMAGE_TINY,            /* 100 bytes: not even the first meta page */
    TU_DAMAGE_PAGE_SIZE,       /* meta page 0 gives a page size of 1000 */
    TU_DAMAGE_PAGE_SIZES,      /* meta page 1 gives 8192, meta page 0 4096 */
    TU_DAMAGE_PAGE_NUMBER,     /* meta page 1 says it is page 7 */
    TU_DAMAGE_LAST_ZERO,       /* the newest meta's last page is 0 */
    TU_DAMAGE_TREE_SELF,       /* the root page of the wal tree names another page (12345) */
    TU_DAMAGE_TREE_TYPE,       /* the root page of the wal tree has the other type (branch for leaf) */
    TU_DAMAGE_TREE_NODE,       /* the root page of the wal tree puts its first node in its header */
    TU_DAMAGE_COUNT
} tu_damage;
extern const struct tu_damage_info {
    const char *name, *says;
    bool tree; /* a tree page's damage: the meta pages pass kw_store_check_file */
} tu_damages[TU_DAMAGE_COUNT];
void tu_damage_apply(const char *mdb, tu_damage d);

/* A file's modification time in nanoseconds. */
uint64_t tu_file_mtime_ns(const char *path);
/* The entries of directory dir other than "." and "..", counted. */
int tu_dir_entries(const char *dir);
/* The process's virtual size in bytes (VmSize of /proc/self/status), 0 if
 * unreadable: the base of an RLIMIT_AS that leaves a test some room. */
uint64_t tu_vm_size(void);
/* The number of newlines in s. */
uint32_t tu_count_lines(const char *s);

/* ---- running a tool ---------------------------------------------------------------------- */

typedef struct tu_run {
    int status;                /* exit status; 128 + the signal when killed */
    char *out, *err;           /* stdout and stderr, NUL-terminated */
    size_t outlen, errlen;
} tu_run;

/* Run bin with args (args[0] is its argv[1]; the list ends at the first
 * NULL) until it exits, stdout and stderr read through pipes (never a
 * terminal: a tool's TTY-only progress stays off). */
tu_run tu_run_argv(const char *bin, const char *const *args);
/* The same for fn() run in a forked child (which exits 0 when fn returns). */
tu_run tu_run_fn(void (*fn)(void));
void tu_run_free(tu_run *r);
/* Reap pid: its exit status, 128 + the signal when it was killed. */
int tu_wait(pid_t pid);
/* Start bin with args (as tu_run_argv) in the background: stdout on a pipe
 * whose read end goes to *out, stderr to errpath (NULL: /dev/null);
 * setup(arg), when given, runs in the child just before the exec (its
 * environment, its signals). Its pid, to reap with tu_wait. */
pid_t tu_spawn_reader(const char *bin, const char *const *args, const char *errpath, void (*setup)(void *arg),
                      void *arg, FILE **out);
/* Wait until process pid's main thread sleeps in (clock_)nanosleep (read
 * from /proc/<pid>/syscall): a process held by a failpoint's delay, or
 * between the polls of keel-wal tail -f. Fails the test, naming `what`,
 * after 60 s. */
void tu_wait_nanosleep(pid_t pid, const char *what);

/* ---- WAL records on disk ------------------------------------------------------------------- */

/* The WAL of the data directory dir, read: the store opened read-only, a
 * read transaction, an iterator from LSN `from` (kw_wal_next(w.it, ...)).
 * No handle of this process may have dir open (LMDB forbids opening one
 * environment twice in a process). */
typedef struct tu_wal_reader {
    kw_store *st;
    kw_rtxn *r;
    kw_walit *it;
} tu_wal_reader;
void tu_wal_open(tu_wal_reader *w, const char *dir, uint64_t from);
/* End the iterator (unless NULL), the transaction and the store. */
void tu_wal_close(tu_wal_reader *w);
/* A malloc'd copy of the record with LSN lsn in the data directory dir
 * (opened read-only). */
void *tu_record_copy(const char *dir, uint64_t lsn, size_t *len);
/* Flip byte `at` of every copy of the n bytes at needle in the file path,
 * as an offline attacker (or a bad disk) would: LMDB may hold stale copies
 * of a page, so all of them. Written back and fsync'ed; the number of
 * copies. */
uint32_t tu_flip_copies(const char *path, const void *needle, size_t n, size_t at);
/* Store rec as the WAL record at lsn of dir (no process has dir open). */
void tu_wal_put(const char *dir, uint64_t lsn, const void *rec, size_t len);
/* Store val under key in database db of dir (no process has dir open). */
void tu_db_put(const char *dir, kw_db db, const void *key, size_t klen, const void *val, size_t vlen);
/* The entity slots the checkpoint of dir claims in its table list; with
 * forge, that record is rewritten (a valid CRC) to claim *forge instead
 * (no process has dir open). */
uint32_t tu_checkpoint_slots(const char *dir, const uint32_t *forge);
/* The message names "LSN <lsn>" (not a longer number starting with it). */
bool tu_names_lsn(const char *msg, uint64_t lsn);

#endif
