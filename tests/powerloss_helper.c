/*
 * powerloss_helper.c -- a tiny program test_powerloss runs with
 * libkeel_powerloss preloaded: it performs the file operations its arguments
 * name, in order, so a test knows exactly which tracked write call is the
 * N-th. Built without sanitizers (it is exec'd with LD_PRELOAD).
 *
 *   powerloss_helper DIR OP...
 *   open NAME FLAGS    make NAME (under DIR; an absolute path as it is) the
 *                      current file; FLAGS: '-' or a comma list of create,
 *                      dsync, append, trunc, wronly (default O_RDWR)
 *   pw OFF LEN CH      pwrite LEN bytes CH at OFF
 *   w LEN CH           write LEN bytes CH at the file position
 *   wv LEN1 CH1 LEN2 CH2   writev of two buffers at the file position
 *   pwv2 OFF LEN CH F  pwritev2; F: dsync (RWF_DSYNC) or 0
 *   seek OFF           lseek to OFF
 *   trunc LEN          ftruncate
 *   fsync, fdatasync, sync, syncfs, sfr (sync_file_range, every flag)
 *   msync OFF LEN      map [OFF, OFF + LEN) read-only shared, msync(MS_SYNC)
 *   mapw CH            map the first page shared writable, store CH at byte 0
 *   dup                the current descriptor becomes a dup of it (the old one
 *                      is closed)
 *   close              close the current descriptor
 *   fclose             fdopen + fclose it (closed where the shim does not see)
 *   dirsync            fsync DIR
 * Exit 0 when every operation succeeded, 3 (with a message) otherwise.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

static const char *g_dir;

static _Noreturn void fail(const char *op)
{
    fprintf(stderr, "powerloss_helper: %s: %s\n", op, strerror(errno));
    exit(3);
}

static char *fill(size_t n, const char *ch)
{
    char *b = malloc(n ? n : 1);
    if (!b)
        fail("malloc");
    memset(b, ch[0], n);
    return b;
}

static int open_file(const char *name, const char *flags)
{
    int f = O_RDWR;
    if (strstr(flags, "wronly"))
        f = O_WRONLY;
    if (strstr(flags, "create"))
        f |= O_CREAT;
    if (strstr(flags, "dsync"))
        f |= O_DSYNC;
    if (strstr(flags, "append"))
        f |= O_APPEND;
    if (strstr(flags, "trunc"))
        f |= O_TRUNC;
    char path[4096];
    if (name[0] == '/')
        snprintf(path, sizeof path, "%s", name);
    else
        snprintf(path, sizeof path, "%s/%s", g_dir, name);
    int fd = open(path, f, 0644);
    if (fd < 0)
        fail(path);
    return fd;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: powerloss_helper DIR OP...\n");
        return 2;
    }
    g_dir = argv[1];
    int fd = -1;
    for (int i = 2; i < argc; i++) {
        const char *op = argv[i];
#define ARG(k) (i + (k) < argc ? argv[i + (k)] : (fprintf(stderr, "powerloss_helper: %s: missing argument\n", op), exit(2), ""))
#define NUM(k) strtoull(ARG(k), NULL, 0)
        if (!strcmp(op, "open")) {
            fd = open_file(ARG(1), ARG(2));
            i += 2;
        } else if (!strcmp(op, "pw")) {
            size_t n = NUM(2);
            char *b = fill(n, ARG(3));
            if (pwrite(fd, b, n, (off_t)NUM(1)) != (ssize_t)n)
                fail(op);
            free(b);
            i += 3;
        } else if (!strcmp(op, "w")) {
            size_t n = NUM(1);
            char *b = fill(n, ARG(2));
            if (write(fd, b, n) != (ssize_t)n)
                fail(op);
            free(b);
            i += 2;
        } else if (!strcmp(op, "wv")) {
            size_t n1 = NUM(1), n2 = NUM(3);
            char *b1 = fill(n1, ARG(2)), *b2 = fill(n2, ARG(4));
            struct iovec v[2] = {{b1, n1}, {b2, n2}};
            if (writev(fd, v, 2) != (ssize_t)(n1 + n2))
                fail(op);
            free(b1);
            free(b2);
            i += 4;
        } else if (!strcmp(op, "pwv2")) {
            size_t n = NUM(2);
            char *b = fill(n, ARG(3));
            struct iovec v = {b, n};
            if (pwritev2(fd, &v, 1, (off_t)NUM(1), strcmp(ARG(4), "dsync") ? 0 : RWF_DSYNC) != (ssize_t)n)
                fail(op);
            free(b);
            i += 4;
        } else if (!strcmp(op, "seek")) {
            if (lseek(fd, (off_t)NUM(1), SEEK_SET) < 0)
                fail(op);
            i += 1;
        } else if (!strcmp(op, "trunc")) {
            if (ftruncate(fd, (off_t)NUM(1)))
                fail(op);
            i += 1;
        } else if (!strcmp(op, "fsync")) {
            if (fsync(fd))
                fail(op);
        } else if (!strcmp(op, "fdatasync")) {
            if (fdatasync(fd))
                fail(op);
        } else if (!strcmp(op, "sync")) {
            sync();
        } else if (!strcmp(op, "syncfs")) {
            if (syncfs(fd))
                fail(op);
        } else if (!strcmp(op, "sfr")) {
            if (sync_file_range(fd, 0, 0,
                                SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER))
                fail(op);
        } else if (!strcmp(op, "msync")) {
            size_t n = NUM(2);
            void *m = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, (off_t)NUM(1));
            if (m == MAP_FAILED || msync(m, n, MS_SYNC) || munmap(m, n))
                fail(op);
            i += 2;
        } else if (!strcmp(op, "mapw")) {
            char *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (m == MAP_FAILED)
                fail(op);
            m[0] = ARG(1)[0];
            if (munmap(m, 4096))
                fail(op);
            i += 1;
        } else if (!strcmp(op, "dup")) {
            int d = dup(fd);
            if (d < 0 || close(fd))
                fail(op);
            fd = d;
        } else if (!strcmp(op, "close")) {
            if (close(fd))
                fail(op);
            fd = -1;
        } else if (!strcmp(op, "fclose")) {
            FILE *f = fdopen(fd, "r+");
            if (!f || fclose(f))
                fail(op);
            fd = -1;
        } else if (!strcmp(op, "dirsync")) {
            int d = open(g_dir, O_RDONLY | O_DIRECTORY);
            if (d < 0 || fsync(d) || close(d))
                fail(op);
        } else {
            fprintf(stderr, "powerloss_helper: unknown operation '%s'\n", op);
            return 2;
        }
#undef ARG
#undef NUM
    }
    return 0;
}
