/*
 * tests/fuzz/replay_main.c -- runs files through a fuzz target without
 * libFuzzer, so any compiler builds it: `make test` replays the committed
 * corpus with gcc and the ASan build replays it under ASan + UBSan.
 *
 *   replay_<target> FILE|DIR...
 *
 * Every regular file (a directory's files in name order) is read into a
 * buffer of exactly its size and passed to LLVMFuzzerTestOneInput. A
 * broken invariant aborts; exit status 1 when no input was found (a wrong
 * corpus path must not pass).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_common.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) || st.st_size < 0) {
        fclose(f);
        return -1;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf || fread(buf, 1, n, f) != n) {
        fprintf(stderr, "%s: cannot read\n", path);
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

/* Files run from path: 1 for a file, its regular files for a directory. */
static long run_path(const char *path)
{
    struct stat st;
    if (stat(path, &st)) {
        perror(path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode))
        return run_file(path) ? -1 : 1;
    struct dirent **names;
    int n = scandir(path, &names, NULL, by_name);
    if (n < 0) {
        perror(path);
        return -1;
    }
    long count = 0;
    for (int i = 0; i < n; i++) {
        char file[4096];
        snprintf(file, sizeof file, "%s/%s", path, names[i]->d_name);
        if (names[i]->d_name[0] != '.' && !stat(file, &st) && S_ISREG(st.st_mode))
            count += run_file(file) ? 0 : 1;
        free(names[i]);
    }
    free(names);
    return count;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    LLVMFuzzerInitialize(&argc, &argv);
    long total = 0;
    for (int i = 1; i < argc; i++) {
        long n = run_path(argv[i]);
        if (n < 0)
            return 1;
        total += n;
    }
    printf("%s: %ld inputs, every invariant held\n", argv[0], total);
    return total > 0 ? 0 : 1;
}
