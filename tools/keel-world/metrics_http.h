/*
 * metrics_http.h -- keel-world --metrics HOST:PORT: the runtime's
 * Prometheus exposition (keel_metrics_write) at http://HOST:PORT/metrics,
 * served by libmicrohttpd on a thread of its own (docs/operations.md
 * "Monitor").
 */
#ifndef KEEL_WORLD_METRICS_HTTP_H
#define KEEL_WORLD_METRICS_HTTP_H

#include <stddef.h>

#include "keel/keel.h"

/* Listen on HOST:PORT ("127.0.0.1:9464", "[::1]:0", "localhost:9464"; port
 * 0: the kernel picks one): the socket, before anything else starts, so a
 * bad address or a port in use is refused up front. On failure prints one
 * line naming the cause and returns -1; on success the listening socket,
 * and the address it is bound to ("127.0.0.1:41234") in `bound`. */
int metrics_listen(const char *hostport, char *bound, size_t n);

typedef struct metrics_http metrics_http;

/* Serve rt's exposition on the listening socket fd (which it owns from
 * now on, also on failure: then NULL, with one line printed). */
metrics_http *metrics_serve(int fd, keel_runtime *rt);
/* Stop serving (waits for a response being written) and close the socket. */
void metrics_stop(metrics_http *h);

#endif
