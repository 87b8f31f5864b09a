/*
 * wire.h: receiving one SOCK_SEQPACKET message and the file descriptors passed with it
 * (SCM_RIGHTS). Shared by init.c and spawner.c, which are compiled as separate programs.
 */
#ifndef TEMPERING_WIRE_H
#define TEMPERING_WIRE_H

#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { WIRE_MAX_FDS = 16 };

/* recvmsg() into buf; keeps at most `max` passed fds in `fds` (closing any beyond, so none
 * leaks) and their count in *nfds. Returns what recvmsg returned. */
static ssize_t recv_with_fds(int sock, char *buf, size_t size, int *fds, int max, int *nfds) {
    char cbuf[CMSG_SPACE(WIRE_MAX_FDS * sizeof(int))];
    struct iovec iov = { buf, size };
    struct msghdr msg = { 0 };
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    *nfds = 0;
    ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) return n;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        int count = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < count; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + (size_t)i * sizeof(int), sizeof fd);
            if (*nfds < max) fds[(*nfds)++] = fd;
            else close(fd);
        }
    }
    return n;
}

#endif
