/*
 * test_util.h -- what the tests of real files and real processes share
 * (tests/test_util.c, compiled into the programs that list it in
 * tests/CMakeLists.txt):
 *
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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- temporary directories ------------------------------------------------------------- */

/* Unchecked fixture (tcase_add_unchecked_fixture): makes the base directory
 * /tmp/keel-<name>-XXXXXX, <name> being the program's name without "test_"
 * (test_walcli: /tmp/keel-walcli-...). It runs in the runner process, so
 * the teardown removes the base even after a test failed or crashed half
 * way; KEEL_<NAME>_KEEP=1 (KEEL_WALCLI_KEEP=1 ...) keeps it for a look.
 * Directories a test made unreadable are made readable again first. */
void tu_base_setup(void);
void tu_base_teardown(void);
/* The base directory of the running test case. */
const char *tu_base(void);
/* base/name into out (not created: the runtime creates its own directory). */
void tu_path(char *out, size_t n, const char *name);
/* Remove dir and everything below it; a missing dir is fine. */
void tu_rmtree(const char *dir);
/* Create path holding the n bytes at p. */
void tu_write_file(const char *path, const void *p, size_t n);

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

/* ---- WAL records on disk ------------------------------------------------------------------- */

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
/* The message names "LSN <lsn>" (not a longer number starting with it). */
bool tu_names_lsn(const char *msg, uint64_t lsn);

#endif
