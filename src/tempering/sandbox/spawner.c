/*
 * tempering-spawner: starts bubblewrap for the host, as the unprivileged sandbox user.
 *
 * The harness is a Python process that may hold gigabytes (a trainer with torch loaded), and
 * fork() copies its page tables: starting each sandbox from it would cost milliseconds, more as
 * it grows. This process is started once, already as the sandbox uid, and forks in
 * microseconds. It dies with the harness (PR_SET_PDEATHSIG), and bubblewrap's
 * --die-with-parent then takes every sandbox with it.
 *
 * Wire format (SOCK_SEQPACKET, native byte order):
 *   host -> spawner  SPAWN   {u32 type=1, u32 id, u32 argc, u32 nfds} argv...\0 + nfds fds;
 *                            the fds become the child's 0, 1, 2, ... in order
 *   spawner -> host  SPAWNED {u32 type=101, u32 id, i32 pid, 0}
 *                    FAILED  {u32 type=102, u32 id, i32 errno, 0}
 *                    EXITED  {u32 type=103, 0, i32 pid, i32 wait_status}
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wire.h"

enum { MSG_SPAWN = 1, MSG_SPAWNED = 101, MSG_FAILED = 102, MSG_EXITED = 103 };
enum { MAX_MSG = 1 << 20, MAX_FDS = 16 };

struct header { uint32_t type, id, a, b; };

static int ctl;
static char buf[MAX_MSG + 1];

static void reply(uint32_t type, uint32_t id, int32_t a, int32_t b) {
    struct header h = { type, id, (uint32_t)a, (uint32_t)b };
    while (send(ctl, &h, sizeof h, MSG_NOSIGNAL) < 0 && errno == EINTR) {}
}

static void spawn(const struct header *h, char *payload, size_t len, int *fds, int nfds) {
    char **argv = calloc(h->a + 1, sizeof(char *));
    char *p = payload, *end = payload + len;
    for (uint32_t i = 0; i < h->a; i++) {
        if (p >= end) { free(argv); reply(MSG_FAILED, h->id, EINVAL, 0); return; }
        argv[i] = p;
        p += strnlen(p, (size_t)(end - p)) + 1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        /* Move the passed fds out of the way, then down to 0..n-1; close everything else. */
        for (int i = 0; i < nfds; i++) fds[i] = fcntl(fds[i], F_DUPFD, 64);
        for (int i = 0; i < nfds; i++) if (fds[i] < 0 || dup2(fds[i], i) < 0) _exit(127);
        syscall(SYS_close_range, (unsigned)nfds, ~0U, 0);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execv(argv[0], argv);
        if (nfds > 2) dprintf(2, "the sandbox uid cannot execute %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    if (pid < 0) reply(MSG_FAILED, h->id, errno, 0);
    else reply(MSG_SPAWNED, h->id, pid, 0);
    free(argv);
}

static void handle(void) {
    int fds[MAX_FDS], nfds = 0;
    ssize_t n = recv_with_fds(ctl, buf, MAX_MSG, fds, MAX_FDS, &nfds);
    if (n == 0) _exit(0); /* the harness is gone */
    if (n < 0) { if (errno == EINTR || errno == EAGAIN) return; _exit(1); }
    struct header h;
    if ((size_t)n >= sizeof h) {
        memcpy(&h, buf, sizeof h);
        buf[n] = 0;
        if (h.type == MSG_SPAWN && (int)h.b == nfds)
            spawn(&h, buf + sizeof h, (size_t)n - sizeof h, fds, nfds);
        else
            reply(MSG_FAILED, h.id, EINVAL, 0);
    }
    for (int i = 0; i < nfds; i++) close(fds[i]);
}

int main(int argc, char **argv) {
    if (argc != 3) return 2; /* tempering-spawner CONTROL_FD HARNESS_PID */
    ctl = atoi(argv[1]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != (pid_t)atoi(argv[2])) return 1; /* the harness died before the prctl */
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) return 1;
    struct pollfd pfd[2] = { { ctl, POLLIN, 0 }, { sfd, POLLIN, 0 } };
    for (;;) {
        if (poll(pfd, 2, -1) < 0) continue;
        if (pfd[1].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) > 0) {}
            int status;
            pid_t pid;
            while ((pid = waitpid(-1, &status, WNOHANG)) > 0) reply(MSG_EXITED, 0, pid, status);
        }
        if (pfd[0].revents & (POLLIN | POLLHUP | POLLERR)) handle();
    }
}
