/*
 * tools/common/nats_cluster.h -- a NATS JetStream cluster of nats-server
 * processes (Debian package nats-server) on loopback, for keel-bench's
 * replication figures and keel-crash's failover mode: free ports, storage
 * and logs under a directory, a node killed and started again on its
 * storage. It links libc only: readiness is each server's /healthz.
 */
#ifndef KEEL_TOOLS_NATS_CLUSTER_H
#define KEEL_TOOLS_NATS_CLUSTER_H

#include <stdbool.h>
#include <sys/types.h>

#define NATS_CLUSTER_MAX 3

typedef struct nats_cluster {
    int n;
    pid_t pid[NATS_CLUSTER_MAX];           /* -1: not running */
    bool starting[NATS_CLUSTER_MAX];       /* restarted, not yet healthy */
    double started_at[NATS_CLUSTER_MAX];   /* CLOCK_MONOTONIC, ms */
    int cport[NATS_CLUSTER_MAX], rport[NATS_CLUSTER_MAX], mport[NATS_CLUSTER_MAX]; /* client, route, monitoring */
    const volatile int *stop;              /* waits end early once *stop (may be NULL) */
    char dir[4096];
    char urls[256];                        /* the client URLs, comma-separated */
} nats_cluster;

/* n (1..NATS_CLUSTER_MAX) nats-server processes on loopback, a cluster when
 * n > 1, storage and logs under dir (made if missing), every one healthy;
 * 0, or -1 with none left running. A server that dies with the calling
 * process (SIGKILL on its death) is never left behind. `stop` as above. */
int nats_cluster_start(nats_cluster *c, const char *dir, int n, const volatile int *stop);
void nats_cluster_kill(nats_cluster *c, int i);    /* SIGKILL node i */
int nats_cluster_restart(nats_cluster *c, int i);  /* start node i again on its storage (healthy later) */
bool nats_cluster_ready(nats_cluster *c);          /* every node runs and the restarted ones answer /healthz */
void nats_cluster_stop(nats_cluster *c);           /* every node, SIGTERM (SIGKILL after 10 s) */
void nats_cluster_remove(const char *path);        /* a stopped cluster's directory, or any tree */

#endif
