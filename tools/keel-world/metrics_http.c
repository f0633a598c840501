/*
 * metrics_http.c -- keel-world's /metrics endpoint (metrics_http.h).
 *
 * keel-world binds the socket itself (metrics_listen) so that a bad
 * address or a port in use ends the run before the data directory is
 * opened, with a sentence naming the cause; libmicrohttpd then serves on
 * that socket (MHD_OPTION_LISTEN_SOCKET) from its own polling thread, which
 * calls keel_metrics_text while the ticks run on the main thread: the
 * library call is safe there and never makes a tick wait.
 *
 * GET or HEAD /metrics: 200 with the exposition. Another path: 404.
 * Another method: 405 with `Allow: GET, HEAD`.
 *
 * Anyone who can reach the port is a client, so none may take the server
 * from the scraper: at most METRICS_PER_IP connections from one address
 * (the rest are closed at once), METRICS_CONNECTIONS in all, an idle one
 * closed after METRICS_IDLE_S. Of libmicrohttpd's own messages only the
 * first is kept, and printed only when the server could not start (why):
 * a line per misbehaving client would let any client fill keel-world's
 * stderr, and its polling thread may meet clients before the start returns.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "metrics_http.h"

#define METRICS_CONNECTIONS 32u
#define METRICS_PER_IP 8u
#define METRICS_IDLE_S 5u          /* a scrape is one request: longer idling only holds a slot */

struct metrics_http {
    struct MHD_Daemon *d;
    keel_runtime *rt;
    size_t hint;                   /* the last exposition's size: the next buffer's start (MHD's thread only) */
    atomic_bool said;              /* why[] holds libmicrohttpd's first message */
    char why[256];
};

/* HOST:PORT -> host and port strings; "[ADDR]:PORT" for IPv6. */
static int split(const char *hp, char *host, size_t hn, char *port, size_t pn)
{
    const char *h = hp, *he, *p;
    if (*hp == '[') {
        h = hp + 1;
        he = strchr(h, ']');
        if (!he || he[1] != ':')
            return -1;
        p = he + 2;
    } else {
        he = strchr(hp, ':');
        if (!he || strchr(he + 1, ':'))
            return -1;
        p = he + 1;
    }
    size_t hl = (size_t)(he - h), pl = strlen(p);
    if (!hl || hl >= hn || !pl || pl > 5 || pl >= pn || strspn(p, "0123456789") != pl || atol(p) > 65535)
        return -1;
    memcpy(host, h, hl);
    host[hl] = 0;
    memcpy(port, p, pl + 1);
    return 0;
}

int metrics_listen(const char *hostport, char *bound, size_t n)
{
    char host[256], port[16];
    if (!hostport || split(hostport, host, sizeof host, port, sizeof port)) {
        fprintf(stderr, "keel-world: --metrics needs HOST:PORT (port 0-65535; [ADDR]:PORT for IPv6), got '%s'\n",
                hostport ? hostport : "");
        return -1;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *res = NULL;
    int g = getaddrinfo(host, port, &hints, &res);
    if (g) {
        fprintf(stderr, "keel-world: --metrics %s: cannot resolve '%s': %s\n", hostport, host, gai_strerror(g));
        return -1;
    }
    int fd = -1, err = 0;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1; /* a restarted server takes its port back at once (not a second listener: no SO_REUSEPORT) */
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) || listen(fd, 64)) {
            err = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        fprintf(stderr, "keel-world: --metrics %s: cannot listen: %s\n", hostport, strerror(err));
        return -1;
    }
    struct sockaddr_storage ss = {.ss_family = AF_UNSPEC}; /* a failed getsockname leaves it unknown: "?:?" */
    socklen_t sl = sizeof ss;
    char h[128] = "?", p[16] = "?";
    if (!getsockname(fd, (struct sockaddr *)&ss, &sl))
        getnameinfo((struct sockaddr *)&ss, sl, h, sizeof h, p, sizeof p, NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(bound, n, ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", h, p);
    return fd;
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *text)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED) /* RFC 9110: a 405 names the methods the resource takes */
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result serve(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                             const char *version, const char *upload, size_t *upload_size, void **req)
{
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)req;
    metrics_http *h = cls;
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    if (strcmp(url, "/metrics"))
        return reply(c, MHD_HTTP_NOT_FOUND, "not found: the metrics are at /metrics\n");
    size_t cap = h->hint + h->hint / 2 + 4096, len = 0;
    char *buf = NULL;
    int rc;
    do { /* the figures may grow between two calls: retry with room to spare */
        free(buf);
        buf = malloc(cap);
        rc = buf ? keel_metrics_text(h->rt, buf, cap, &len) : KEEL_ENOMEM;
        cap = 2 * len + 1;
    } while (rc == KEEL_ENOSPC);
    if (rc) {
        free(buf);
        fprintf(stderr, "keel-world: /metrics: %s: %s\n", keel_strerror(rc), keel_last_error());
        return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "the metrics could not be written\n");
    }
    h->hint = len;
    struct MHD_Response *r = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(buf);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, KEEL_METRICS_CONTENT_TYPE);
    enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

/* libmicrohttpd's messages: the first kept (the one that says why a start
 * failed, whose threads have ended when it returns), the rest dropped. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    metrics_http *h = cls;
    bool first = false;
    if (!atomic_compare_exchange_strong(&h->said, &first, true))
        return;
    vsnprintf(h->why, sizeof h->why, fmt, ap);
    h->why[strcspn(h->why, "\n")] = 0;
}

metrics_http *metrics_serve(int fd, keel_runtime *rt)
{
    metrics_http *h = calloc(1, sizeof *h);
    struct sockaddr_storage ss = {.ss_family = AF_UNSPEC};
    socklen_t sl = sizeof ss;
    /* MHD_USE_AUTO: poll or epoll, not select(), which cannot take a descriptor >= FD_SETSIZE */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG;
    if (!getsockname(fd, (struct sockaddr *)&ss, &sl) && ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    if (h) {
        h->rt = rt;
        h->d = MHD_start_daemon(flags, 0, NULL, NULL, serve, h, /* the logger first: it takes the messages after it */
                                MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h, MHD_OPTION_LISTEN_SOCKET, fd,
                                MHD_OPTION_CONNECTION_LIMIT, METRICS_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                METRICS_PER_IP, MHD_OPTION_CONNECTION_TIMEOUT, METRICS_IDLE_S, MHD_OPTION_END);
    }
    if (!h || !h->d) {
        fprintf(stderr, "keel-world: --metrics: cannot start the HTTP server (libmicrohttpd%s%s)\n",
                h && h->why[0] ? ": " : "", h ? h->why : "");
        close(fd);
        free(h);
        return NULL;
    }
    return h;
}

void metrics_stop(metrics_http *h)
{
    if (!h)
        return;
    MHD_stop_daemon(h->d); /* closes the listening socket */
    free(h);
}
