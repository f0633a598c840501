/*
 * tools/bench/bench_nats.c -- a NATS JetStream cluster on loopback for the
 * replication figures: N nats-server processes (Debian package nats-server)
 * on free ports, routes between them, storage in a temporary directory;
 * ready once a stream can be created on it; stopped and removed after.
 */
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "keel_repl/repl.h"

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    int port = fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) && !getsockname(fd, (struct sockaddr *)&a, &len)
                   ? ntohs(a.sin_port) : -1;
    if (fd >= 0)
        close(fd);
    return port;
}

static pid_t spawn_server(const char *conf)
{
    pid_t pid = fork();
    if (pid == 0) {
        FILE *null = freopen("/dev/null", "w", stdout);
        (void)null;
        null = freopen("/dev/null", "w", stderr);
        execlp("nats-server", "nats-server", "-c", conf, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Ready: a stream (R = n) can be created, i.e. JetStream has a meta leader. */
static bool wait_ready(const bench_nats *b)
{
    struct timespec pause = { 0, 100 * 1000000L };
    for (int i = 0; i < 300; i++) {
        kr_node *node;
        if (!kr_connect(&(kr_desc){ .urls = b->urls, .world = "bench_probe", .create = true }, &node)) {
            kr_close(node);
            return true;
        }
        nanosleep(&pause, NULL);
    }
    return false;
}

bool bench_nats_start(bench_nats *b, int n)
{
    memset(b, 0, sizeof *b);
    char *dir = make_tmpdir("nats");
    snprintf(b->dir, sizeof b->dir, "%s", dir);
    free(dir);
    int client[BENCH_NATS_MAX], route[BENCH_NATS_MAX];
    char routes[512] = "";
    for (int i = 0; i < n; i++) {
        client[i] = free_port();
        route[i] = free_port();
        size_t l = strlen(routes);
        snprintf(routes + l, sizeof routes - l, "%snats-route://127.0.0.1:%d", i ? ", " : "", route[i]);
    }
    for (int i = 0; i < n; i++) {
        char conf[600];
        snprintf(conf, sizeof conf, "%s/s%d.conf", b->dir, i);
        FILE *f = fopen(conf, "w");
        if (!f)
            return false;
        fprintf(f, "server_name: s%d\nlisten: 127.0.0.1:%d\njetstream { store_dir: \"%s/s%d\", max_mem: 64M }\n", i,
                client[i], b->dir, i);
        if (n > 1)
            fprintf(f, "cluster { name: keelbench, listen: 127.0.0.1:%d, routes: [%s] }\n", route[i], routes);
        fclose(f);
        b->pid[b->n++] = spawn_server(conf);
        size_t l = strlen(b->urls);
        snprintf(b->urls + l, sizeof b->urls - l, "%snats://127.0.0.1:%d", i ? "," : "", client[i]);
    }
    if (wait_ready(b))
        return true;
    bench_nats_stop(b);
    return false;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

void bench_nats_stop(bench_nats *b)
{
    for (int i = 0; i < b->n; i++)
        if (b->pid[i] > 0)
            kill(b->pid[i], SIGTERM);
    for (int i = 0; i < b->n; i++)
        if (b->pid[i] > 0)
            waitpid(b->pid[i], NULL, 0);
    b->n = 0;
    if (b->dir[0]) /* the servers' storage is a tree */
        nftw(b->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    b->dir[0] = 0;
}
