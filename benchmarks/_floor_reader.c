/* The floor of reading each streamed chunk as it arrives, without Python: the same requests as
 * _floor_reader.py (Poisson arrivals, 16-token prompts, TOKENS-token streams, one connection
 * per request), one epoll loop, one recv per readable socket, nothing parsed. Its CPU per chunk
 * is what the kernel's wake-up, epoll and recv cost on this host; _floor_reader.py's, less
 * this, is what one Python callback per read adds. Built by the peers benchmark where a C
 * compiler is found (cc -O2), skipped where not.
 *
 *     _floor_reader_c HOST PORT RATE SECONDS TOKENS SEED
 *
 * Prints one JSON line: requests, reads per request.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_EVENTS 256
#define END "0\r\n\r\n" /* the chunked body's last chunk: the server writes it with the last token */

typedef struct {
    int fd;
    long reads;
    char tail[5]; /* the stream's last 5 bytes, across reads */
} conn_t;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void arm(int tfd, int64_t at_ns) {
    struct itimerspec v = {{0, 0}, {at_ns / 1000000000LL, at_ns % 1000000000LL}};
    if (timerfd_settime(tfd, TFD_TIMER_ABSTIME, &v, NULL) < 0) {
        perror("timerfd_settime");
        exit(1);
    }
}

static int open_stream(struct sockaddr_in *addr, const char *request, size_t len) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (fd < 0 || connect(fd, (struct sockaddr *)addr, sizeof *addr) < 0) {
        perror("connect");
        exit(1);
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (size_t sent = 0; sent < len;) { /* a few hundred bytes: one send on loopback */
        ssize_t n = send(fd, request + sent, len - sent, 0);
        if (n < 0) {
            perror("send");
            exit(1);
        }
        sent += (size_t)n;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); /* a spurious wake-up must not block the loop */
    return fd;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s HOST PORT RATE SECONDS TOKENS SEED\n", argv[0]);
        return 2;
    }
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2]))};
    if (inet_pton(AF_INET, argv[1], &addr.sin_addr) != 1) {
        fprintf(stderr, "HOST: %s is not an IPv4 address\n", argv[1]);
        return 2;
    }
    double rate = atof(argv[3]), seconds = atof(argv[4]);
    int tokens = atoi(argv[5]);
    srand48(atol(argv[6]));
    char body[256], request[512];
    int blen = snprintf(body, sizeof body,
                        "{\"model\": \"bench-model\", \"prompt\": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, "
                        "14, 15], \"max_tokens\": %d, \"stream\": true}",
                        tokens);
    char buf[65536];
    int ep = epoll_create1(0), tfd = timerfd_create(CLOCK_MONOTONIC, 0);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL}, events[MAX_EVENTS];
    epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev);
    int64_t start = now_ns(), end = start + (int64_t)(seconds * 1e9);
    int64_t next = start + (int64_t)(-log(1.0 - drand48()) / rate * 1e9);
    long requests = 0, done = 0, reads = 0, open = 0;
    int sending = next < end;
    if (sending)
        arm(tfd, next);
    while (sending || open > 0) {
        int n = epoll_wait(ep, events, MAX_EVENTS, -1);
        if (n < 0 && errno == EINTR)
            continue;
        for (int i = 0; i < n; i++) {
            conn_t *c = events[i].data.ptr;
            if (c == NULL) { /* the send timer: every request now due */
                uint64_t expirations;
                if (read(tfd, &expirations, sizeof expirations) < 0 && errno != EAGAIN) {
                    perror("read timerfd");
                    return 1;
                }
                while (sending && next <= now_ns()) {
                    int len = snprintf(request, sizeof request,
                                       "POST /v1/completions HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: "
                                       "application/json\r\nX-Request-Id: floor-c-%ld\r\nContent-Length: %d\r\n\r\n%s",
                                       argv[1], argv[2], requests, blen, body);
                    c = calloc(1, sizeof *c);
                    c->fd = open_stream(&addr, request, (size_t)len);
                    struct epoll_event cev = {.events = EPOLLIN, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &cev);
                    requests++;
                    open++;
                    next += (int64_t)(-log(1.0 - drand48()) / rate * 1e9);
                    sending = next < end;
                }
                if (sending)
                    arm(tfd, next);
                continue;
            }
            ssize_t got = recv(c->fd, buf, sizeof buf, 0);
            if (got < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            c->reads++;
            if (got > 0) { /* keep the stream's last 5 bytes, however the reads split them */
                size_t keep = got >= 5 ? 5 : (size_t)got;
                memmove(c->tail, c->tail + keep, 5 - keep);
                memcpy(c->tail + 5 - keep, buf + got - keep, keep);
            }
            if (got <= 0 || memcmp(c->tail, END, 5) == 0) {
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                reads += c->reads;
                done++;
                open--;
                free(c);
            }
        }
    }
    printf("{\"requests\": %ld, \"reads_per_request\": %.2f}\n", done, done ? (double)reads / done : 0.0);
    return 0;
}
