/* What one read of a UDP socket's queue costs in the kernel by recvfrom()
   and by recvmmsg(), with no event loop and no Python: the probe behind the
   compiled datagram transport's choice between them
   (asyncio_relaxed/_speedups_datagram.pxi, MMSG_FROM; docs/benchmarks.md,
   "Datagrams").  Each round sends K datagrams of 1 KiB over loopback to a
   non-blocking socket and times reading them all, until the socket is dry:
     mode 0: recvfrom() a datagram, until EAGAIN (the pure build's batch);
     mode 1: recvmmsg() of up to WANT, until one returns fewer than WANT;
     mode 2: one recvfrom(), then recvmmsg() for the rest.
   Build and run (pinned to one CPU):
     gcc -O2 -o /tmp/recvmmsg benchmarks/probes/recvmmsg.c
     for k in 1 2 4 10; do for m in 0 1 2; do taskset -c 0 /tmp/recvmmsg $m $k 200000; done; done
   Usage: recvmmsg MODE K ROUNDS [WANT (32)] */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define WIDTH 32
#define SLOT 65536

static char *buf;
static struct mmsghdr msgs[WIDTH];
static struct iovec iov[WIDTH];
static struct sockaddr_storage names[WIDTH];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* recvfrom() until EAGAIN: the calls made. */
static long by_recvfrom(int s) {
    long calls = 0;
    for (;;) {
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        calls++;
        if (recvfrom(s, buf, SLOT, 0, (struct sockaddr *)&sa, &len) < 0)
            return calls;
    }
}

/* recvmmsg() of up to `want` into slots from `first` on, until one returns
   fewer: the calls made. */
static long by_recvmmsg(int s, int want, int first) {
    long calls = 0;
    for (;;) {
        for (int i = 0; i < want; i++) {
            iov[i].iov_base = buf + (size_t)(first + i) * SLOT;
            iov[i].iov_len = SLOT;
            msgs[i].msg_hdr = (struct msghdr){.msg_name = &names[i],
                                              .msg_namelen = sizeof names[i],
                                              .msg_iov = &iov[i], .msg_iovlen = 1};
        }
        calls++;
        if (recvmmsg(s, msgs, want, 0, NULL) < want)
            return calls;
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODE K ROUNDS [WANT]\n", argv[0]);
        return 2;
    }
    int mode = atoi(argv[1]), k = atoi(argv[2]), rounds = atoi(argv[3]);
    int want = argc > 4 ? atoi(argv[4]) : WIDTH;
    if (want < 2 || want > WIDTH) {
        fprintf(stderr, "WANT: 2 to %d\n", WIDTH);
        return 2;
    }
    if (posix_memalign((void **)&buf, 4096, (size_t)(WIDTH + 1) * SLOT) != 0)
        return 1;
    int server = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    int client = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    if (bind(server, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        getsockname(server, (struct sockaddr *)&addr, &len) != 0) {
        perror("bind");
        return 1;
    }
    char message[1024];
    memset(message, 'x', sizeof message);
    double spent = 0;
    long calls = 0;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < k; i++)
            sendto(client, message, sizeof message, 0, (struct sockaddr *)&addr, sizeof addr);
        double start = now();
        if (mode == 0) {
            calls += by_recvfrom(server);
        } else if (mode == 1) {
            calls += by_recvmmsg(server, want, 0);
        } else {
            struct sockaddr_storage sa;
            socklen_t salen = sizeof sa;
            calls++;
            if (recvfrom(server, buf, SLOT, 0, (struct sockaddr *)&sa, &salen) >= 0)
                calls += by_recvmmsg(server, want - 1, 1);
        }
        spent += now() - start;
    }
    printf("mode %d, %d datagrams a round, want %d: %.0f ns a datagram, %.2f calls a datagram\n",
           mode, k, want, spent / rounds / k * 1e9, (double)calls / rounds / k);
    return 0;
}
