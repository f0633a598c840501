/*
 * tools/keel-world/params.c -- world.params, the creation parameters of the
 * world in a data directory.
 *
 * A data directory holds one world, and the world is a function of the
 * parameters it was created with (--seed, --entities). A run that gave
 * other values would not start another world: it would go on with the
 * recovered one under a generator seeded differently, a mix of two worlds
 * whose hash matches neither. So keel-world records them when it creates
 * the world and refuses a run that contradicts them (main.c). The record
 * is a small text file beside data.mdb, written once (temporary name,
 * synced, renamed, directory synced); `keel-wal backup` copies it with the
 * data. docs/operations.md has the operator's side.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "world.h"

#define PARAMS_FILE "world.params"

int params_read(const char *dir, world_params *p)
{
    char path[4200], line[200];
    snprintf(path, sizeof path, "%s/" PARAMS_FILE, dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT || errno == ENOTDIR) /* no world yet, or no directory: the runtime says which */
            return 0;
        fprintf(stderr, "keel-world: cannot read %s: %s\n", path, strerror(errno));
        return -1;
    }
    bool seed = false, entities = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long long v;
        char *end;
        if (line[0] == '#' || line[0] == '\n')
            continue;
        char *eq = strchr(line, '=');
        errno = 0;
        v = eq ? strtoull(eq + 1, &end, 10) : 0;
        if (eq && !errno && end != eq + 1 && (*end == '\n' || !*end)) {
            if (!strncmp(line, "seed=", 5)) {
                p->seed = v;
                seed = true;
                continue;
            }
            if (!strncmp(line, "entities=", 9) && v <= UINT32_MAX) {
                p->entities = (uint32_t)v;
                entities = true;
                continue;
            }
        }
        fprintf(stderr, "keel-world: %s: unreadable line '%.*s'\n", path, (int)strcspn(line, "\n"), line);
        fclose(f);
        return -1;
    }
    fclose(f);
    if (!seed || !entities) {
        fprintf(stderr, "keel-world: %s lacks %s\n", path, seed ? "entities=" : "seed=");
        return -1;
    }
    return 1;
}

int params_write(const char *dir, const world_params *p)
{
    char path[4200], tmp[4220], text[300];
    snprintf(path, sizeof path, "%s/" PARAMS_FILE, dir);
    snprintf(tmp, sizeof tmp, "%s.new", path);
    int n = snprintf(text, sizeof text,
                     "# keel-world: the parameters this world was created with; a run that\n"
                     "# contradicts them is refused (a directory holds one world)\n"
                     "seed=%" PRIu64 "\nentities=%u\n", p->seed, p->entities);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    bool ok = fd >= 0 && write(fd, text, (size_t)n) == n && fsync(fd) == 0;
    if (fd >= 0)
        close(fd);
    ok = ok && rename(tmp, path) == 0;
    int dfd = ok ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    ok = ok && dfd >= 0 && fsync(dfd) == 0;
    if (dfd >= 0)
        close(dfd);
    if (!ok) {
        fprintf(stderr, "keel-world: cannot record the world's parameters in %s: %s\n", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}
