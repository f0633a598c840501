/*
 * tools/bench/bench_nats.c -- the NATS JetStream cluster of the
 * replication figures: tools/common/nats_cluster.c's servers with their
 * storage in a temporary directory, ready once a stream can be created on
 * them (JetStream has a meta leader); stopped and removed after.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "keel_repl/repl.h"

/* Ready: a stream (R = n) can be created, i.e. JetStream has a meta leader. */
static bool stream_ready(const bench_nats *b)
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
    char *dir = make_tmpdir("nats");
    int rc = nats_cluster_start(b, dir, n, NULL);
    free(dir);
    if (!rc && stream_ready(b))
        return true;
    bench_nats_stop(b);
    return false;
}

void bench_nats_stop(bench_nats *b)
{
    nats_cluster_stop(b);
    if (b->dir[0]) /* the servers' storage is a tree */
        nats_cluster_remove(b->dir);
    b->dir[0] = 0;
}
