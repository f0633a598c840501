/*
 * tools/keel-wal/kwt.h -- the pieces every keel-wal subcommand shares.
 *
 * keel-wal links libkeel_wal (+ keel_base) only, never the runtime. The
 * CMake target `keel-wal` (tools/CMakeLists.txt) already lists every source
 * of the tool, including walstate's state.c, replay.c and diff.c.
 *
 * Owned by the walcli helper (common.c, main.c, info/dump/verify/stats/tail);
 * walstate appends the declarations of its own files in the marked section
 * at the end of this header.
 *
 * Conventions for a subcommand:
 *   - `int kwt_cmd_<name>(int argc, char **argv)`: argv[0] is the subcommand's
 *     name, argv[1..] its arguments; the return value is the exit status;
 *   - `--help` / `-h` anywhere prints the usage on stdout and returns 0
 *     (kwt_help_requested + kwt_print_help);
 *   - exit status: KWT_EXIT_OK 0, KWT_EXIT_PROBLEM 1 (verify findings),
 *     KWT_EXIT_USAGE 2 (bad arguments, the directory cannot be opened, or
 *     out of memory: main turns any command that ran out into a 2);
 *   - errors go to stderr as "keel-wal: <dir or file>: <cause>" (kwt_err);
 *     usage errors as "keel-wal <cmd>: <problem> (try 'keel-wal <cmd> --help')";
 *   - data on stdout, nothing else; progress only on a TTY stderr;
 *   - a subcommand that reads one directory is a parser and a body handed
 *     to kwt_run_on_dir, which does the rest (help, open, close, output).
 *
 * Entity handles (docs/tools.md): printed as 16 lower-case hex digits, the
 * raw u64 handle (generation in the high 8 digits, slot index in the low 8),
 * the same form keel-world's reports use. Parsed from that form, from
 * 0x<hex>, or from INDEX:GEN (decimal).
 */
#ifndef KEEL_TOOLS_KWT_H
#define KEEL_TOOLS_KWT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "keel_wal/wal.h"

#define KWT_EXIT_OK 0
#define KWT_EXIT_PROBLEM 1  /* verify found a problem */
#define KWT_EXIT_USAGE 2    /* bad arguments, the directory cannot be opened, out of memory */

/* ---- subcommands ---------------------------------------------------------- */

int kwt_cmd_info(int argc, char **argv);
int kwt_cmd_dump(int argc, char **argv);
int kwt_cmd_verify(int argc, char **argv);
int kwt_cmd_stats(int argc, char **argv);
int kwt_cmd_tail(int argc, char **argv);
int kwt_cmd_replay(int argc, char **argv);   /* walstate: replay.c */
int kwt_cmd_diff(int argc, char **argv);     /* walstate: diff.c */
int kwt_cmd_backup(int argc, char **argv);   /* backup.c */
int kwt_cmd_restore(int argc, char **argv);  /* backup.c */
int kwt_cmd_detach(int argc, char **argv);   /* detach.c */

typedef struct kwt_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;      /* one line for `keel-wal --help` */
} kwt_command;

/* The table main.c dispatches on, ended by a {NULL} entry. */
extern const kwt_command kwt_commands[];

/* ---- errors and arguments -------------------------------------------------- */

/* "keel-wal: <what>: <cause>\n" on stderr, what = a directory or file. */
void kwt_err(const char *what, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "keel-wal <cmd>: <problem> (try 'keel-wal <cmd> --help')" on stderr;
 * returns KWT_EXIT_USAGE. */
int kwt_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* LMDB trusts the pages of data.mdb: a damaged or truncated file can fault
 * (SIGSEGV/SIGBUS) inside it. main installs a handler that says so
 * ("keel-wal: <dir>/data.mdb: ...") and exits with code; verify raises the
 * code to KWT_EXIT_PROBLEM while it scans. dir may be NULL. */
void kwt_guard_set(const char *dir, int code);

/* Output to a closed pipe (keel-wal dump | head): SIGPIPE is ignored, so
 * writes fail with EPIPE. Loops stop when kwt_output_broken(); at the end
 * kwt_output_finish(rc) flushes stdout and returns rc, unchanged when all
 * was written or the reader went away (EPIPE), else it reports the write
 * error and returns KWT_EXIT_USAGE. */
bool kwt_output_broken(void);
/* True when stdout is a pipe whose reader has gone (checked without
 * writing: tail -f asks between polls). */
bool kwt_output_reader_gone(void);
int kwt_output_finish(int rc);

/* Out of memory in keel-wal's own code: noted, so that main makes the
 * command exit 2 ("the output is incomplete") whatever the call site went
 * on to do. kwt_out_of_memory: noted here, or seen by libkeel_wal. */
void kwt_note_out_of_memory(void);
bool kwt_out_of_memory(void);

/* True when argv[1..] holds --help or -h. */
bool kwt_help_requested(int argc, char **argv);
/* Print text on stdout and return KWT_EXIT_OK. */
int kwt_print_help(const char *text);

/* Options take "--name VALUE" or "--name=VALUE". kwt_opt returns 1 when
 * argv[*i] is option name (*val set, *i advanced to its last word), 0 when
 * it is something else, -1 after a usage error (value missing). */
int kwt_opt(const char *cmd, int argc, char **argv, int *i, const char *name, const char **val);
/* The same for an unsigned decimal (or 0x hex) number; -1 on a bad number. */
int kwt_opt_u64(const char *cmd, int argc, char **argv, int *i, const char *name, uint64_t *val);
/* An argument the subcommand has no option for: a word starting with '-'
 * is an unknown option, anything else the data directory (one only).
 * 0, or KWT_EXIT_USAGE after the usage error. kwt_need_dir ends the loop:
 * the usage error when no directory was given. */
int kwt_arg_dir(const char *cmd, const char *arg, const char **dir);
int kwt_need_dir(const char *cmd, const char *dir);
/* Parse an unsigned decimal or 0x-hex number, the whole string; false when bad. */
bool kwt_parse_u64(const char *s, uint64_t *out);

/* ---- entity handles -------------------------------------------------------- */

#define KWT_ENTITY_INDEX(e) ((uint32_t)(e))
#define KWT_ENTITY_GEN(e) ((uint32_t)((e) >> 32))

/* Accepts 16 hex digits (the printed form), 0x<hex> (1..16 digits) or
 * INDEX:GEN (decimal, both < 2^32). False when s is none of these. */
bool kwt_parse_entity(const char *s, uint64_t *out);
/* The printed form: 16 lower-case hex digits and a NUL. */
const char *kwt_format_entity(uint64_t e, char buf[17]);

/* ---- the data directory ---------------------------------------------------- */

typedef struct kwt_dir {
    const char *path;
    kw_store *store;          /* opened KW_OPEN_READONLY: works beside a live server */
    kw_codec_ctx *codec;      /* for kw_record_payload */
    bool has_schema;          /* the stored schema decoded into `schema` */
    kw_schema schema;         /* ncomps 0 when absent or unreadable */
    char schema_error[256];   /* why the stored schema is unreadable ("" = fine or absent) */
    bool has_checkpoint;      /* meta "checkpoint" present and decoded */
    kw_checkpoint_meta checkpoint;
    char checkpoint_error[256]; /* why meta "checkpoint" is unreadable ("" = fine or absent) */
    bool replicated;          /* kept in step with a stream (meta "replicated"): its checkpoint markers are
                                 its primaries', not (all) its own */
    char stream_name[128];    /* ... that stream's name, as the mark holds it (cut to fit) */
    struct kr_node *stream;   /* a stream address (nats://HOST:PORT/WORLD): its copy is `store` */
    char copy[4096];          /* ... a private directory, removed at close */
} kwt_dir;

/* Open data directory `path` read-only (a stream address: copy the
 * stream into a private directory and open that) and load the stored schema and the
 * checkpoint pointer (one read transaction, ended before returning). An
 * unreadable schema or checkpoint does not fail the open: it is described
 * in schema_error / checkpoint_error for the subcommand to report.
 * Returns 0, or prints "keel-wal: <path>: <cause>" and returns
 * KWT_EXIT_PROBLEM for a damaged data.mdb (empty, truncated, a bad meta
 * page: kw_store_check_file) or KWT_EXIT_USAGE (missing, not a keel
 * directory, not LMDB, a newer format version, I/O error). */
int kwt_dir_open(const char *path, kwt_dir *d);
/* The same for a directory no process writes, such as a finished backup:
 * LMDB makes no lock file in it (KW_OPEN_NOLOCK), so it is left as found. */
int kwt_dir_open_still(const char *path, kwt_dir *d);
void kwt_dir_close(kwt_dir *d);
/* A stream: copy what it gained since the last call (tail -f polls it); a
 * directory: nothing to do. Prints the error and returns KWT_EXIT_USAGE. */
int kwt_dir_refresh(kwt_dir *d);
/* verify's checks of an open directory, its problems one per line on
 * stderr, no summary: 0, KWT_EXIT_PROBLEM when any was found, or the exit
 * status of what stopped it (verify.c). */
int kwt_check_dir(kwt_dir *d);
/* True when path is a stream address (nats://...). */
bool kwt_is_stream(const char *path);
/* Remove a stream's private copy (its LMDB files and the directory). */
void kwt_remove_copy(const char *dir);
/* kw_store_backup of dir into dest, what it makes in dest removed also
 * when SIGINT, SIGTERM or SIGHUP ends the process meanwhile (then ended by
 * that signal). 0 or its KEEL_E* code (keel_last_error() says why). */
int kwt_backup(const char *dir, const char *dest);

/* The shape of a subcommand that reads one data directory (all but info):
 * --help anywhere prints help; parse(argc, argv, opts) reads the arguments
 * into opts and returns 0 or, after a usage error, the exit status; *dir
 * (read after parse: opts' directory field) is opened (kwt_dir_open),
 * body(d, opts) runs, the directory is closed and body's status goes
 * through kwt_output_finish. */
typedef int (*kwt_parse_fn)(int argc, char **argv, void *opts);
typedef int (*kwt_body_fn)(kwt_dir *d, void *opts);
int kwt_run_on_dir(int argc, char **argv, const char *help, kwt_parse_fn parse, void *opts, const char *const *dir,
                   kwt_body_fn body);

/* Begin a read transaction (a fresh snapshot each call; tail -f calls it
 * per poll). Prints the error and returns KWT_EXIT_USAGE on failure. Hold
 * at most one per directory at a time (kw_read_begin's rule). */
int kwt_read_begin(kwt_dir *d, kw_rtxn **out);

/* The payload of a checked record (decompressed into d->codec's scratch:
 * valid until the next call). 0 or a KEEL_E* code (keel_last_error says why). */
int kwt_payload(kwt_dir *d, const kw_record *r, const void **payload);

/* kw_scan_next, telling a bad record from a failed scan: 1 a valid record
 * in *out; KWT_SCAN_INVALID a record that fails its checks (out->lsn names
 * it, keel_last_error() says why; the next call continues after it); 0 at
 * the end; a negative KEEL_E* code when the scan cannot go on (an LMDB
 * error, a WAL key that is not 8 bytes). */
#define KWT_SCAN_INVALID 2
int kwt_scan_next(kw_scan *s, kw_record *out);

/* The component's name from the stored schema, or "#<id>" when unknown
 * (written into buf). */
const char *kwt_comp_name(const kwt_dir *d, uint32_t id, char buf[16]);
/* Component id by name in the stored schema, 0 when absent. */
uint32_t kwt_comp_find(const kwt_dir *d, const char *name);
/* "u32", "f64", "entity", "bytes" ... "?" for an unknown type. */
const char *kwt_type_name(uint32_t type);
/* Width in bytes of one element of a field type, 0 when unknown. */
uint32_t kwt_type_size(uint32_t type);
/* "versioned", "single_version", "transient", "?" */
const char *kwt_discipline_name(uint32_t discipline);

/* ---- JSON output ------------------------------------------------------------
 * Values are formatted from the stored schema: a component value is an
 * object {"field": value, ...} in field order; an array field (count > 1)
 * is a JSON array; u*, i* are integers; f32/f64 numbers (%.9g / %.17g;
 * NaN and infinities as the strings "nan", "inf", "-inf"); bool true/false
 * (a byte other than 0/1 prints as its number); entity the 16-hex-digit
 * string; bytes a hex string. A tag prints {}. A value whose component is
 * not in the schema, or whose size differs from it, prints as a hex string
 * of its bytes. */

void kwt_json_string(FILE *f, const char *s);
void kwt_json_entity(FILE *f, uint64_t e);
void kwt_json_hex(FILE *f, const void *p, size_t n);
/* One field of a value (value = the whole component value of `size` bytes). */
void kwt_json_field(FILE *f, const kw_field *fl, const void *value, size_t size);
/* A whole component value. */
void kwt_json_value(FILE *f, const kwt_dir *d, uint32_t comp, const void *value, size_t size);
/* A schema: [{"id":1,"name":"pos","size":12,"align":4,"discipline":"versioned",
 * "fields":[{"name":"x","type":"f32","offset":0,"count":1},...]},...] */
void kwt_json_schema(FILE *f, const kw_schema *s);
/* One decoded change: {"op":"set","entity":"..","component":"Name","value":{..}};
 * spawn lists "components":{"Name":{..},...}; destroy has neither; remove
 * has "component" only. */
void kwt_json_change(FILE *f, const kwt_dir *d, const kw_change *c);

/* Print one WAL record as `dump` does (text or JSON line, no filters);
 * KWT_EXIT_PROBLEM after reporting a record that does not decode (dump.c). */
int kwt_print_record(kwt_dir *d, const kw_record *r, bool json);

/* ---- progress on a TTY --------------------------------------------------------
 * Long work (verify, stats, replay...) shows "<what> <done>/<total> (<pct>%)"
 * on stderr, redrawn at most ~10 times a second, only when stderr is a
 * terminal (never in pipes or files). */

typedef struct kwt_progress {
    bool on;
    const char *what;
    uint64_t total;
    uint64_t next_check;      /* step count at which the clock is read again */
    uint64_t last_ns;
} kwt_progress;

void kwt_progress_begin(kwt_progress *p, const char *what, uint64_t total);
void kwt_progress_step(kwt_progress *p, uint64_t done);
/* Erase the line. */
void kwt_progress_end(kwt_progress *p);

/* ---- walstate (state.c, replay.c, diff.c) ------------------------------------
 * Declarations owned by the walstate helper go below this line. */

#endif
