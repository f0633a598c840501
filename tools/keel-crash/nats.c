/*
 * nats.c -- a NATS JetStream cluster of nats-server processes on loopback
 * for keel-crash's failover mode: free ports, storage in the work
 * directory, a node killed (SIGKILL) and started again on the same storage.
 * Readiness is the monitoring port's /healthz answering 200, read over a
 * plain socket: keel-crash links no NATS client.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
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

#include "kc.h"

#define NATS_READY_MS 60000.0

/* n ports nobody listens on now, all different: each is the kernel's pick
 * for a socket kept bound until the last is picked (a port closed at once
 * may be picked again by the next bind). */
static int free_ports(int *ports, int n)
{
    int fds[3 * KC_NATS_MAX], rc = 0, i = 0;
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

static int spawn(kc_nats *ns, int i)
{
    char conf[sizeof ns->dir + 16], log[sizeof ns->dir + 16];
    snprintf(conf, sizeof conf, "%s/n%d.conf", ns->dir, i);
    snprintf(log, sizeof log, "%s/n%d.log", ns->dir, i);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* keel-crash dies: so does the server */
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
    ns->pid[i] = pid;
    return 0;
}

/* Until node i answers /healthz (it exited: -1 at once). */
static int wait_ready(kc_nats *ns, int i)
{
    double until = kc_now_ms() + NATS_READY_MS;
    while (kc_now_ms() < until && !kc_stop) {
        if (healthy(ns->mport[i]))
            return 0;
        int st;
        if (waitpid(ns->pid[i], &st, WNOHANG) == ns->pid[i]) {
            ns->pid[i] = -1;
            return -1;
        }
        nanosleep(&(struct timespec){0, 50 * 1000000L}, NULL);
    }
    return -1;
}

static int write_conf(const kc_nats *ns, int i)
{
    char path[sizeof ns->dir + 16], routes[512] = "";
    size_t n = 0;
    for (int k = 0; k < ns->n; k++)
        n += (size_t)snprintf(routes + n, sizeof routes - n, "%snats-route://127.0.0.1:%d", k ? ", " : "",
                              ns->rport[k]);
    snprintf(path, sizeof path, "%s/n%d.conf", ns->dir, i);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "server_name: n%d\nlisten: 127.0.0.1:%d\nhttp: 127.0.0.1:%d\n"
            "jetstream { store_dir: \"%s/n%d\", max_mem: 256M, max_file: 4G }\n", i, ns->cport[i], ns->mport[i],
            ns->dir, i);
    if (ns->n > 1)
        fprintf(f, "cluster { name: kc, listen: 127.0.0.1:%d, routes: [%s] }\n", ns->rport[i], routes);
    return fclose(f) ? -1 : 0;
}

/* One try of kc_nats_start on fresh ports. */
static int start_once(kc_nats *ns, const char *dir, int n)
{
    *ns = (kc_nats){.n = n};
    for (int i = 0; i < KC_NATS_MAX; i++)
        ns->pid[i] = -1;
    snprintf(ns->dir, sizeof ns->dir, "%s", dir);
    int ports[3 * KC_NATS_MAX];
    if (free_ports(ports, 3 * n))
        return -1;
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        ns->cport[i] = ports[3 * i];
        ns->rport[i] = ports[3 * i + 1];
        ns->mport[i] = ports[3 * i + 2];
        len += (size_t)snprintf(ns->urls + len, sizeof ns->urls - len, "%snats://127.0.0.1:%d", i ? "," : "",
                                ns->cport[i]);
    }
    for (int i = 0; i < n; i++)
        if (write_conf(ns, i) || spawn(ns, i)) {
            kc_nats_stop(ns);
            return -1;
        }
    for (int i = 0; i < n; i++)
        if (wait_ready(ns, i)) {
            kc_nats_stop(ns);
            return -1;
        }
    return 0;
}

/* A server that exits at once has mostly found its port taken meanwhile
 * (another process's pick between ours and its bind): the cluster starts
 * again on other ports with empty storage, up to START_TRIES times (each
 * server's log keeps every try). */
#define START_TRIES 3

int kc_nats_start(kc_nats *ns, const char *dir, int n)
{
    if (n < 1 || n > KC_NATS_MAX || (mkdir(dir, 0755) && errno != EEXIST))
        return -1;
    int rc = -1;
    for (int t = 0; t < START_TRIES && rc && !kc_stop; t++) {
        for (int i = 0; t && i < n; i++) {
            char store[sizeof ns->dir + 16];
            snprintf(store, sizeof store, "%s/n%d", dir, i);
            kc_rm_tree(store);
        }
        rc = start_once(ns, dir, n);
    }
    return rc;
}

void kc_nats_kill(kc_nats *ns, int i)
{
    if (ns->pid[i] <= 0)
        return;
    kill(ns->pid[i], SIGKILL);
    while (waitpid(ns->pid[i], NULL, 0) < 0 && errno == EINTR)
        ;
    ns->pid[i] = -1;
}

int kc_nats_restart(kc_nats *ns, int i)
{
    kc_nats_kill(ns, i);
    if (spawn(ns, i))
        return -1;
    ns->starting[i] = true;
    ns->started_at[i] = kc_now_ms();
    return 0;
}

bool kc_nats_ready(kc_nats *ns)
{
    bool ready = true;
    for (int i = 0; i < ns->n; i++) {
        if (ns->pid[i] <= 0)
            return false;
        if (ns->starting[i] && healthy(ns->mport[i]))
            ns->starting[i] = false;
        ready &= !ns->starting[i];
    }
    return ready;
}

void kc_nats_stop(kc_nats *ns)
{
    for (int i = 0; i < ns->n; i++)
        if (ns->pid[i] > 0)
            kill(ns->pid[i], SIGTERM);
    double until = kc_now_ms() + 10000;
    for (int i = 0; i < ns->n; i++) {
        while (ns->pid[i] > 0) {
            int st;
            pid_t w = waitpid(ns->pid[i], &st, WNOHANG);
            if (w == ns->pid[i] || (w < 0 && errno != EINTR)) {
                ns->pid[i] = -1;
            } else if (kc_now_ms() > until) {
                kc_nats_kill(ns, i); /* a server that does not stop on SIGTERM */
            } else {
                nanosleep(&(struct timespec){0, 20 * 1000000L}, NULL);
            }
        }
    }
}
