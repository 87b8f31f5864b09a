/*
 * tempering-spawner: starts bubblewrap for the host, each sandbox as its own unprivileged uid.
 *
 * The harness is a Python process that may hold gigabytes (a trainer with torch loaded), and
 * fork() copies its page tables: starting each sandbox from it would cost milliseconds, more as
 * it grows. This process is started once and forks in microseconds. It dies with the harness
 * (PR_SET_PDEATHSIG), and bubblewrap's --die-with-parent then takes every sandbox with it.
 *
 * Each sandbox runs as a host uid of its own (the host leases it, see uids.py), so that the
 * kernel's per-user counters (inotify instances, pipe pages, RLIMIT_NPROC, message queue bytes,
 * user namespaces...) are not shared between sandboxes. So this process keeps CAP_SETUID and
 * CAP_SETGID, and nothing else: it runs as a uid of its own below the sandboxes' range, and its
 * child becomes the requested uid (only one of that range) and drops both before executing
 * bubblewrap.
 *
 * A fork of a sandbox on a volume runs as a uid of its own over files that its parent's uid
 * owns on disk: the host shows them to it through an idmapped mount, whose mapping is a user
 * namespace that this process makes (USERNS: it alone may map uids of the range).
 *
 * Wire format (SOCK_SEQPACKET, native byte order):
 *   host -> spawner  SPAWN   {u32 type=1, u32 id, u32 argc, u32 nfds, u32 uid, u32 gid}
 *                            argv...\0 + nfds fds; the fds become the child's 0, 1, 2, ... in order
 *                    USERNS  {u32 type=2, u32 id, u32 inside, u32 outside, 0, 0}: a user
 *                            namespace mapping uid and gid `inside` to `outside` (both of the range)
 *   spawner -> host  SPAWNED {u32 type=101, u32 id, i32 pid, 0}
 *                    FAILED  {u32 type=102, u32 id, i32 errno, 0}
 *                    EXITED  {u32 type=103, 0, i32 pid, i32 wait_status}
 *                    USERNS  {u32 type=104, u32 id, 0, 0} + the namespace's fd
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <grp.h>
#include <linux/capability.h>
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

enum { MSG_SPAWN = 1, MSG_USERNS = 2 };
enum { MSG_SPAWNED = 101, MSG_FAILED = 102, MSG_EXITED = 103, MSG_USERNS_READY = 104 };
enum { MAX_MSG = 1 << 20, MAX_FDS = 16 };

struct header { uint32_t type, id, a, b; };
struct request { struct header h; uint32_t uid, gid; };

static int ctl;
static uint32_t first_uid, last_uid; /* the range a sandbox may run as */
static char buf[MAX_MSG + 1];

static void reply(uint32_t type, uint32_t id, int32_t a, int32_t b) {
    struct header h = { type, id, (uint32_t)a, (uint32_t)b };
    while (send(ctl, &h, sizeof h, MSG_NOSIGNAL) < 0 && errno == EINTR) {}
}

static int in_range(uint32_t id) { return id >= first_uid && id <= last_uid; }

/* Keep exactly `caps` (a mask of CAP_SETUID and CAP_SETGID, or 0) in every set of this process. */
static int keep_caps(uint32_t caps) {
    struct __user_cap_header_struct hdr = { _LINUX_CAPABILITY_VERSION_3, 0 };
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    data[0].effective = data[0].permitted = caps;
    return (int)syscall(SYS_capset, &hdr, data);
}

static void spawn(const struct request *r, char *payload, size_t len, int *fds, int nfds) {
    const struct header *h = &r->h;
    if (!in_range(r->uid) || !in_range(r->gid)) {
        reply(MSG_FAILED, h->id, EPERM, 0);
        return;
    }
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
        if (setgroups(0, NULL) < 0 || setresgid(r->gid, r->gid, r->gid) < 0 ||
            setresuid(r->uid, r->uid, r->uid) < 0 || keep_caps(0) < 0) {
            if (nfds > 2) dprintf(2, "the spawner cannot become uid %u: %s\n", r->uid, strerror(errno));
            _exit(127);
        }
        execv(argv[0], argv);
        if (nfds > 2) dprintf(2, "the sandbox uid cannot execute %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    if (pid < 0) reply(MSG_FAILED, h->id, errno, 0);
    else reply(MSG_SPAWNED, h->id, pid, 0);
    free(argv);
}

static int write_map(pid_t pid, const char *which, const char *map) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", pid, which);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = write(fd, map, strlen(map));
    int err = errno;
    close(fd);
    errno = err;
    return n < 0 ? -1 : 0;
}

/* A helper child enters a new user namespace; this process (CAP_SETUID and CAP_SETGID here)
 * writes its maps, keeps a descriptor of it and sends that to the host. */
static void make_userns(const struct request *r) {
    uint32_t inside = r->h.a, outside = r->h.b;
    if (!in_range(inside) || !in_range(outside)) { reply(MSG_FAILED, r->h.id, EPERM, 0); return; }
    int sync[2];
    if (pipe2(sync, O_CLOEXEC) < 0) { reply(MSG_FAILED, r->h.id, errno, 0); return; }
    pid_t pid = fork();
    if (pid == 0) {
        char b = 0;
        prctl(PR_SET_DUMPABLE, 1, 0, 0, 0); /* so that its uid may open its /proc files */
        if (unshare(CLONE_NEWUSER) < 0) _exit(1);
        if (write(sync[1], &b, 1) != 1) _exit(1);
        pause();
        _exit(0);
    }
    int err = pid < 0 ? errno : 0, ns = -1;
    char b, map[64], path[64];
    close(sync[1]);
    if (!err && read(sync[0], &b, 1) != 1) err = ECHILD;
    snprintf(map, sizeof map, "%u %u 1\n", inside, outside);
    if (!err && (write_map(pid, "uid_map", map) < 0 || write_map(pid, "gid_map", map) < 0)) err = errno;
    snprintf(path, sizeof path, "/proc/%d/ns/user", pid);
    if (!err && (ns = open(path, O_RDONLY | O_CLOEXEC)) < 0) err = errno;
    close(sync[0]);
    if (pid > 0) kill(pid, SIGKILL); /* the namespace lives on in `ns`; SIGCHLD reaps it */
    if (err) { reply(MSG_FAILED, r->h.id, err, 0); return; }
    struct header h = { MSG_USERNS_READY, r->h.id, 0, 0 };
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = { &h, sizeof h };
    struct msghdr msg = { 0 };
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &ns, sizeof ns);
    while (sendmsg(ctl, &msg, MSG_NOSIGNAL) < 0 && errno == EINTR) {}
    close(ns);
}

static void handle(void) {
    int fds[MAX_FDS], nfds = 0;
    ssize_t n = recv_with_fds(ctl, buf, MAX_MSG, fds, MAX_FDS, &nfds);
    if (n == 0) _exit(0); /* the harness is gone */
    if (n < 0) { if (errno == EINTR || errno == EAGAIN) return; _exit(1); }
    struct request r;
    if ((size_t)n >= sizeof r) {
        memcpy(&r, buf, sizeof r);
        buf[n] = 0;
        if (r.h.type == MSG_SPAWN && (int)r.h.b == nfds)
            spawn(&r, buf + sizeof r, (size_t)n - sizeof r, fds, nfds);
        else if (r.h.type == MSG_USERNS && nfds == 0)
            make_userns(&r);
        else
            reply(MSG_FAILED, r.h.id, EINVAL, 0);
    } else if ((size_t)n >= sizeof r.h) {
        memcpy(&r.h, buf, sizeof r.h);
        reply(MSG_FAILED, r.h.id, EINVAL, 0);
    }
    for (int i = 0; i < nfds; i++) close(fds[i]);
}

int main(int argc, char **argv) {
    /* tempering-spawner CONTROL_FD HARNESS_PID OWN_UID FIRST_UID LAST_UID, started as root */
    if (argc != 6) return 2;
    ctl = atoi(argv[1]);
    uid_t own = (uid_t)strtoul(argv[3], NULL, 10);
    first_uid = (uint32_t)strtoul(argv[4], NULL, 10);
    last_uid = (uint32_t)strtoul(argv[5], NULL, 10);
    if (own == 0 || first_uid == 0 || first_uid > last_uid || (own >= first_uid && own <= last_uid))
        return 2;
    const uint32_t setid = (1U << CAP_SETUID) | (1U << CAP_SETGID);
    for (int cap = 0; cap <= 63; cap++)
        if (cap != CAP_SETUID && cap != CAP_SETGID) prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
    if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) < 0 || setgroups(0, NULL) < 0 ||
        setresgid(own, own, own) < 0 || setresuid(own, own, own) < 0 || keep_caps(setid) < 0)
        return 1;
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* no process of its uid may trace it */
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* after the uid change, which would clear it */
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
