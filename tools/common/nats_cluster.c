/*
 * tools/common/nats_cluster.c -- the NATS cluster of keel-bench and
 * keel-crash (nats_cluster.h). Readiness is the monitoring port's /healthz
 * answering 200, read over a plain socket: no NATS client is linked.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nats_cluster.h"

#define NATS_READY_MS 60000.0

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static bool stopping(const nats_cluster *c)
{
    return c->stop && *c->stop;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

void nats_cluster_remove(const char *path)
{
    nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* n ports nobody listens on now, all different: each is the kernel's pick
 * for a socket kept bound until the last is picked (a port closed at once
 * may be picked again by the next bind). */
static int free_ports(int *ports, int n)
{
    int fds[3 * NATS_CLUSTER_MAX], rc = 0, i = 0;
    for (; i < n && !rc; i++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof a;
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&a, sizeof a) ||
            getsockname(fds[i], (struct sockaddr *)&a, &len))
            rc = -1;
        ports[i] = ntohs(a.sin_port);
    }
    while (i--)
        if (fds[i] >= 0)
            close(fds[i]);
    return rc;
}

/* GET /healthz on the monitoring port: does it answer 200? */
static bool healthy(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool ok = false;
    struct timeval tv = {.tv_sec = 2};
    if (fd >= 0 && !setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) &&
        !connect(fd, (struct sockaddr *)&a, sizeof a)) {
        static const char req[] = "GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        char buf[64] = "";
        if (write(fd, req, sizeof req - 1) == (ssize_t)(sizeof req - 1)) {
            ssize_t n = read(fd, buf, sizeof buf - 1);
            buf[n > 0 ? n : 0] = '\0';
            ok = !strncmp(buf, "HTTP/1.", 7) && !strncmp(buf + 8, " 200", 4);
        }
    }
    if (fd >= 0)
        close(fd);
    return ok;
}

static int spawn(nats_cluster *c, int i)
{
    char conf[sizeof c->dir + 16], log[sizeof c->dir + 16];
    snprintf(conf, sizeof conf, "%s/n%d.conf", c->dir, i);
    snprintf(log, sizeof log, "%s/n%d.log", c->dir, i);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* the caller dies: so does the server */
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (getppid() != parent || fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
            _exit(126);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execlp("nats-server", "nats-server", "-c", conf, (char *)NULL);
        _exit(127);
    }
    if (pid < 0)
        return -1;
    c->pid[i] = pid;
    return 0;
}

/* Until node i answers /healthz (it exited: -1 at once). */
static int wait_ready(nats_cluster *c, int i)
{
    double until = now_ms() + NATS_READY_MS;
    while (now_ms() < until && !stopping(c)) {
        if (healthy(c->mport[i]))
            return 0;
        int st;
        if (waitpid(c->pid[i], &st, WNOHANG) == c->pid[i]) {
            c->pid[i] = -1;
            return -1;
        }
        nanosleep(&(struct timespec){0, 50 * 1000000L}, NULL);
    }
    return -1;
}

static int write_conf(const nats_cluster *c, int i)
{
    char path[sizeof c->dir + 16], routes[512] = "";
    size_t n = 0;
    for (int k = 0; k < c->n; k++)
        n += (size_t)snprintf(routes + n, sizeof routes - n, "%snats-route://127.0.0.1:%d", k ? ", " : "",
                              c->rport[k]);
    snprintf(path, sizeof path, "%s/n%d.conf", c->dir, i);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "server_name: n%d\nlisten: 127.0.0.1:%d\nhttp: 127.0.0.1:%d\n"
            "jetstream { store_dir: \"%s/n%d\", max_mem: 256M, max_file: 4G }\n", i, c->cport[i], c->mport[i],
            c->dir, i);
    if (c->n > 1)
        fprintf(f, "cluster { name: keel, listen: 127.0.0.1:%d, routes: [%s] }\n", c->rport[i], routes);
    return fclose(f) ? -1 : 0;
}

/* One try of nats_cluster_start on fresh ports. */
static int start_once(nats_cluster *c, const char *dir, int n)
{
    *c = (nats_cluster){.n = n, .stop = c->stop};
    for (int i = 0; i < NATS_CLUSTER_MAX; i++)
        c->pid[i] = -1;
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    int ports[3 * NATS_CLUSTER_MAX];
    if (free_ports(ports, 3 * n))
        return -1;
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        c->cport[i] = ports[3 * i];
        c->rport[i] = ports[3 * i + 1];
        c->mport[i] = ports[3 * i + 2];
        len += (size_t)snprintf(c->urls + len, sizeof c->urls - len, "%snats://127.0.0.1:%d", i ? "," : "",
                                c->cport[i]);
    }
    for (int i = 0; i < n; i++)
        if (write_conf(c, i) || spawn(c, i)) {
            nats_cluster_stop(c);
            return -1;
        }
    for (int i = 0; i < n; i++)
        if (wait_ready(c, i)) {
            nats_cluster_stop(c);
            return -1;
        }
    return 0;
}

/* A server that exits at once has mostly found its port taken meanwhile
 * (another process's pick between ours and its bind): the cluster starts
 * again on other ports with empty storage, up to START_TRIES times (each
 * server's log keeps every try). */
#define START_TRIES 3

int nats_cluster_start(nats_cluster *c, const char *dir, int n, const volatile int *stop)
{
    *c = (nats_cluster){.stop = stop};
    for (int i = 0; i < NATS_CLUSTER_MAX; i++)
        c->pid[i] = -1;
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    if (n < 1 || n > NATS_CLUSTER_MAX || (mkdir(dir, 0755) && errno != EEXIST))
        return -1;
    int rc = -1;
    for (int t = 0; t < START_TRIES && rc && !stopping(c); t++) {
        for (int i = 0; t && i < n; i++) {
            char store[sizeof c->dir + 16];
            snprintf(store, sizeof store, "%s/n%d", dir, i);
            nats_cluster_remove(store);
        }
        rc = start_once(c, dir, n);
    }
    return rc;
}

void nats_cluster_kill(nats_cluster *c, int i)
{
    if (c->pid[i] <= 0)
        return;
    kill(c->pid[i], SIGKILL);
    while (waitpid(c->pid[i], NULL, 0) < 0 && errno == EINTR)
        ;
    c->pid[i] = -1;
}

int nats_cluster_restart(nats_cluster *c, int i)
{
    nats_cluster_kill(c, i);
    if (spawn(c, i))
        return -1;
    c->starting[i] = true;
    c->started_at[i] = now_ms();
    return 0;
}

bool nats_cluster_ready(nats_cluster *c)
{
    bool ready = true;
    for (int i = 0; i < c->n; i++) {
        if (c->pid[i] <= 0)
            return false;
        if (c->starting[i] && healthy(c->mport[i]))
            c->starting[i] = false;
        ready &= !c->starting[i];
    }
    return ready;
}

void nats_cluster_stop(nats_cluster *c)
{
    for (int i = 0; i < c->n; i++)
        if (c->pid[i] > 0)
            kill(c->pid[i], SIGTERM);
    double until = now_ms() + 10000;
    for (int i = 0; i < c->n; i++) {
        while (c->pid[i] > 0) {
            int st;
            pid_t w = waitpid(c->pid[i], &st, WNOHANG);
            if (w == c->pid[i] || (w < 0 && errno != EINTR)) {
                c->pid[i] = -1;
            } else if (now_ms() > until) {
                nats_cluster_kill(c, i); /* a server that does not stop on SIGTERM */
            } else {
                nanosleep(&(struct timespec){0, 20 * 1000000L}, NULL);
            }
        }
    }
}
