/*
 * tempering-init: PID 1 of a local sandbox (and of a docker backend's container).
 *
 * bubblewrap (or the Docker engine) builds the namespaces and the read-only root, then executes
 * this program as the sandbox's first process. It does three things and nothing else:
 *
 *   1. While it still holds CAP_SYS_ADMIN inside the sandbox's own user namespace, it mounts one
 *      size-limited tmpfs and binds directories of it at the workdir, /tmp, /dev/shm, /logs and /tests,
 *      so all three count against one disk budget (unless the host bound a copy-on-write volume
 *      there instead, or passed a fork's volume as an idmapped mount for it to attach: its files
 *      belong to the parent's uid on disk and to this sandbox's here); nothing else is
 *      writable. Then it becomes an ordinary user in a nested user namespace, with no
 *      capability left, and installs a seccomp filter.
 *   2. It is a fork server: the host sends EXEC requests over a SOCK_SEQPACKET socket (argv[1]),
 *      with the command's stdin/stdout/stderr as SCM_RIGHTS file descriptors. A command in a
 *      live sandbox costs one fork here, never a new sandbox.
 *   3. It reaps, reports exit statuses, and kills whole process trees on request.
 *
 * A sandbox that must keep its processes apart (argv[7] "notrace": grading sandboxes) refuses
 * the ways one process changes another of the same uid or takes its descriptors: attaching a
 * tracer (ptrace PTRACE_ATTACH and PTRACE_SEIZE; a child may still ask its parent to trace
 * it, as debuggers start their programs), pidfd_getfd, process_vm_readv/writev, and any
 * write below /proc (where /proc/PID/mem is: a Landlock domain of init's that every command
 * inherits). Otherwise the tested code, started by a test runner, could take the runner's
 * stdout or rewrite its memory and its verdict. Reading /proc/PID/mem and reopening a pipe
 * through /proc/PID/fd stay open (docs/sandbox.md): Landlock cannot refuse reads below /proc
 * without refusing /proc/self too.
 *
 * A sandbox with network (argv[8], a list of policy rules) has a network namespace of its own,
 * which the host wires to a user-mode stack (slirp4netns). Before it drops CAP_NET_ADMIN, PID 1
 * installs routing rules there that refuse destinations (loopback of the host behind the stack,
 * link-local, private ranges, the host's own addresses) whatever routes exist: rules are looked
 * up before any route, so nothing added later (the stack's own link routes) can get around
 * them, and nothing in the sandbox can remove them, as no command holds a capability.
 *
 * Every command runs under a "shepherd": a child of init that is a child subreaper and forks the
 * command. Whatever the command starts (double forks and setsid daemons included) stays a
 * descendant of the shepherd, so a timeout can kill all of it and nothing else. The shepherd
 * exits with the command's status as soon as the command exits; daemons it leaves behind are
 * reparented to init and live until the sandbox closes.
 *
 * Wire format (native byte order, both ends run on this machine):
 *   host -> init  EXEC  {u32 type=1, u32 id, u32 nargs, u32 nenv} cwd\0 argv...\0 env...\0 + 3 fds
 *                 KILL  {u32 type=2, u32 id, u32 signal, u32 mode}  mode 0: the whole tree;
 *                       mode 1: only processes started since the last MARK (not the main one)
 *                 MARK  {u32 type=3, u32 id, 0, 0}  remember the processes of id's tree now
 *                 KILLALL {u32 type=4, u32 id, 0, 0}  SIGKILL every process but PID 1 (what
 *                       commands left behind too); answered with MARKED once none is left
 *   init -> host  READY {u32 type=100, 0, 0, 0} [error text]
 *                 EXIT  {u32 type=101, u32 id, i32 wait_status, 0}
 *                 MARKED{u32 type=102, u32 id, 0, 0}
 *                 FAIL  {u32 type=103, u32 id, i32 errno, 0} error text (the command never ran)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/fib_rules.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "domains.h"
#include "wire.h"

enum { MSG_EXEC = 1, MSG_KILL = 2, MSG_MARK = 3, MSG_KILL_ALL = 4, MSG_CGROUP = 5 };
enum { MSG_READY = 100, MSG_EXIT = 101, MSG_MARKED = 102, MSG_FAIL = 103 };
static int CTL_FD = 3;
enum { MAX_MSG = 1 << 20, MAX_JOBS = 4096, MAX_PROCS = 65536 };

struct header { uint32_t type, id, a, b; };

struct job { uint32_t id; pid_t shepherd; pid_t main; pid_t *marked; int nmarked; };

static struct job jobs[MAX_JOBS];
static int njobs;
static char msgbuf[MAX_MSG + 1];
extern char **environ;

static void send_msg(uint32_t type, uint32_t id, uint32_t a, const char *text) {
    char buf[sizeof(struct header) + 512];
    struct header h = { type, id, a, 0 };
    size_t n = text ? strnlen(text, 511) : 0;
    memcpy(buf, &h, sizeof h);
    if (n) memcpy(buf + sizeof h, text, n);
    while (send(CTL_FD, buf, sizeof h + n, MSG_NOSIGNAL) < 0 && errno == EINTR) {}
}

static void die_setup(const char *what) {
    char text[256];
    snprintf(text, sizeof text, "sandbox setup failed: %s: %s", what, strerror(errno));
    send_msg(MSG_READY, 0, 1, text);
    _exit(1);
}

/* ---------- setup: disk, capabilities, seccomp ---------- */

/* Directories of the disk bound at the same path (host.py's HARBOR_DIRS). */
static const char *const HARBOR_DIRS[] = { "/logs", "/tests", NULL };

/* The spec's writable_dirs, ":"-separated ("-": none): each is the disk's rw/<path>, bound at
 * <path> (host.py's disk_dirs); `make` creates it on a fresh disk (a fork's has it). */
static void bind_writable_dirs(const char *disk, const char *dirs, int make) {
    if (strcmp(dirs, "-") == 0) return;
    char *copy = strdup(dirs), *save = NULL, path[512], what[600];
    if (!copy) die_setup("strdup");
    for (char *dir = strtok_r(copy, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
        if (dir[0] != '/' || snprintf(path, sizeof path, "%s/rw%s", disk, dir) >= (int)sizeof path) {
            errno = EINVAL;
            die_setup(dir);
        }
        for (char *p = path + strlen(disk) + 1; make && *p; p++) { /* mkdir -p */
            if (*p != '/') continue;
            *p = 0;
            if (mkdir(path, 0755) < 0 && errno != EEXIST) die_setup("mkdir a writable dir");
            *p = '/';
        }
        if (make && mkdir(path, 0755) < 0 && errno != EEXIST) die_setup("mkdir a writable dir");
        snprintf(what, sizeof what, "bind writable dir %s", dir);
        if (mount(path, dir, NULL, MS_BIND, NULL) < 0) die_setup(what);
    }
    free(copy);
}

static void setup_disk(unsigned long long disk_bytes, const char *workdir, const char *dirs) {
    const char *disk = "/.tempering/disk";
    char opts[128], path[256];
    /* One inode per 4 KiB (spec.py's INODE_SPACING, whose memory the host counted in the
     * size it passed): without a cap, empty files would fill memory, not the disk. */
    snprintf(opts, sizeof opts, "size=%llu,nr_inodes=%llu,mode=0755", disk_bytes,
             disk_bytes / 4096 < 256 ? 256ULL : disk_bytes / 4096);
    if (mount("tmpfs", disk, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0) die_setup("mount tmpfs");
    snprintf(path, sizeof path, "%s/workspace", disk);
    if (mkdir(path, 0755) < 0) die_setup("mkdir workspace");
    if (mount(path, workdir, NULL, MS_BIND, NULL) < 0) die_setup("bind workdir");
    snprintf(path, sizeof path, "%s/tmp", disk);
    if (mkdir(path, 01777) < 0 || chmod(path, 01777) < 0) die_setup("mkdir tmp");
    if (mount(path, "/tmp", NULL, MS_BIND, NULL) < 0) die_setup("bind /tmp");
    /* bubblewrap's /dev/shm sits in its own /dev tmpfs, which it made read-only: POSIX shared
     * memory gets a directory of this disk instead, in the same budget. */
    snprintf(path, sizeof path, "%s/shm", disk);
    if (mkdir(path, 01777) < 0 || chmod(path, 01777) < 0) die_setup("mkdir shm");
    if (mount(path, "/dev/shm", NULL, MS_BIND, NULL) < 0) die_setup("bind /dev/shm");
    /* /logs and /tests, as harbor's environments have them (a task's verifier writes its
     * reward to /logs/verifier; its hidden tests are at /tests while it grades) */
    for (const char *const *dir = HARBOR_DIRS; *dir != NULL; dir++) {
        snprintf(path, sizeof path, "%s%s", disk, *dir);
        if (mkdir(path, 0755) < 0) die_setup("mkdir a harbor directory");
        if (mount(path, *dir, NULL, MS_BIND, NULL) < 0) die_setup("bind a harbor directory");
    }
    bind_writable_dirs(disk, dirs, 1);
    if (umount2(disk, MNT_DETACH) < 0) die_setup("detach disk");
}

/* ---------- network: refusing destinations by policy rules ---------- */

/* One RTM_NEWRULE: "to PREFIX" with action unreachable (deny) or lookup main (allow), at
 * priority `pref`; the kernel's acknowledgement is awaited so a failure fails the start. */
static void add_rule(int nl, const char *spec, uint32_t pref, uint32_t seq) {
    char text[64], *slash;
    unsigned char addr[16];
    int deny = spec[0] == '-';
    if ((spec[0] != '-' && spec[0] != '+') || strlen(spec + 1) >= sizeof text) {
        errno = EINVAL;
        die_setup(spec);
    }
    strcpy(text, spec + 1);
    slash = strchr(text, '/');
    if (!slash) { errno = EINVAL; die_setup(spec); }
    *slash = 0;
    int family = strchr(text, ':') ? AF_INET6 : AF_INET;
    int len = atoi(slash + 1), bytes = family == AF_INET6 ? 16 : 4;
    if (inet_pton(family, text, addr) != 1 || len < 0 || len > 8 * bytes) {
        errno = EINVAL;
        die_setup(spec);
    }
    struct {
        struct nlmsghdr nh;
        struct fib_rule_hdr rule;
        char attrs[64];
    } req;
    memset(&req, 0, sizeof req);
    req.nh.nlmsg_type = RTM_NEWRULE;
    req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK;
    req.nh.nlmsg_seq = seq;
    req.rule.family = (unsigned char)family;
    req.rule.dst_len = (unsigned char)len;
    req.rule.action = deny ? FR_ACT_UNREACHABLE : FR_ACT_TO_TBL;
    req.rule.table = deny ? RT_TABLE_UNSPEC : RT_TABLE_MAIN;
    size_t off = NLMSG_LENGTH(sizeof req.rule);
    struct { uint16_t type; const void *data; size_t len; } attrs[] = {
        { FRA_DST, addr, (size_t)bytes }, { FRA_PRIORITY, &pref, sizeof pref },
    };
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        struct rtattr *rta = (struct rtattr *)((char *)&req + NLMSG_ALIGN(off));
        rta->rta_type = attrs[i].type;
        rta->rta_len = (unsigned short)RTA_LENGTH(attrs[i].len);
        memcpy(RTA_DATA(rta), attrs[i].data, attrs[i].len);
        off = NLMSG_ALIGN(off) + RTA_ALIGN(rta->rta_len);
    }
    req.nh.nlmsg_len = (uint32_t)off;
    if (send(nl, &req, off, 0) < 0) die_setup("netlink send");
    char reply[512];
    ssize_t n = recv(nl, reply, sizeof reply, 0);
    if (n < (ssize_t)NLMSG_LENGTH(sizeof(struct nlmsgerr))) die_setup("netlink reply");
    struct nlmsgerr *err = NLMSG_DATA((struct nlmsghdr *)reply);
    if (err->error != 0) {
        errno = -err->error;
        die_setup(spec);
    }
}

/* `rules`: comma-separated "+PREFIX" (route normally) and "-PREFIX" (unreachable), first
 * match wins, in the order given. */
static void setup_network(const char *rules) {
    int nl = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (nl < 0) die_setup("netlink socket");
    char *copy = strdup(rules), *save = NULL;
    uint32_t pref = 100, seq = 1;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        add_rule(nl, tok, pref++, seq++);
    free(copy);
    close(nl);
}

/* A fork's volume arrives as a detached idmapped mount (fd): its files are its parent's uid's on
 * disk and this sandbox's uid's here. Attach it where the tmpfs would go, and bind the same three
 * directories of it. */
static void setup_volume(int tree, const char *workdir, const char *dirs) {
    const char *disk = "/.tempering/disk";
    char path[256];
    if (syscall(SYS_move_mount, tree, "", AT_FDCWD, disk, 0x00000004 /* F_EMPTY_PATH */) < 0)
        die_setup("attach the volume");
    close(tree);
    snprintf(path, sizeof path, "%s/workspace", disk);
    if (mount(path, workdir, NULL, MS_BIND, NULL) < 0) die_setup("bind workdir");
    snprintf(path, sizeof path, "%s/tmp", disk);
    if (mount(path, "/tmp", NULL, MS_BIND, NULL) < 0) die_setup("bind /tmp");
    snprintf(path, sizeof path, "%s/shm", disk);
    if (mount(path, "/dev/shm", NULL, MS_BIND, NULL) < 0) die_setup("bind /dev/shm");
    for (const char *const *dir = HARBOR_DIRS; *dir != NULL; dir++) {
        snprintf(path, sizeof path, "%s%s", disk, *dir);
        if (mount(path, *dir, NULL, MS_BIND, NULL) < 0) die_setup("bind a harbor directory");
    }
    bind_writable_dirs(disk, dirs, 0);
    if (umount2(disk, MNT_DETACH) < 0) die_setup("detach disk");
}

/* Every sandbox's ptys come out of one machine-wide count (kernel.pty.max less its reserve for
 * the host): bubblewrap's devpts has no maximum of its own, so one sandbox could take them all.
 * A devpts instance of its own, mounted over bubblewrap's, holds at most PTYS_PER_SANDBOX. */
#define PTYS_PER_SANDBOX "32" /* the docker backend's too (docker.py) */
static void setup_ptys(void) {
    if (mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
              "newinstance,ptmxmode=0666,mode=0620,max=" PTYS_PER_SANDBOX) < 0)
        die_setup("mount devpts");
}

static void write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, text, strlen(text)) < 0) die_setup(path);
    close(fd);
}

/* SysV IPC objects outlive the processes that made them, and their memory is charged to the
 * sandbox's cgroup: once segments and queues that no process holds fill it, the OOM killer's
 * only candidate left is this init (the sandbox dies: red team, round twenty-nine). In the
 * sandbox's own IPC namespace, a shared memory segment goes with its last user, and queues and
 * semaphore sets are a few. The docker backend asks the engine for the same (docker.py), the
 * grading zygote sets them per grading (inside_zygote.py). */
#define IPC_MSGMNI "16"          /* message queues of 16 KiB at most (msgmnb): 256 KiB */
#define IPC_SEM "250 8000 32 32" /* semmsl semmns semopm semmni */
static void setup_ipc(void) {
    write_file("/proc/sys/kernel/shm_rmid_forced", "1");
    write_file("/proc/sys/kernel/msgmni", IPC_MSGMNI);
    write_file("/proc/sys/kernel/sem", IPC_SEM);
}

/* bubblewrap ran us as uid 0 of a user namespace that owns the mount namespace, which is what
 * mounting needed. Commands run as an ordinary user instead: a nested user namespace maps `uid`
 * onto that uid 0 (itself the host's unprivileged sandbox uid), so files the sandbox writes are
 * owned by `uid` inside. Every capability and the bounding set go before any command runs. */
static void become_user(uid_t uid, gid_t gid) {
    char map[64];
    if (unshare(CLONE_NEWUSER) < 0) die_setup("unshare user namespace");
    write_file("/proc/self/setgroups", "deny");
    snprintf(map, sizeof map, "%u 0 1\n", (unsigned)uid);
    write_file("/proc/self/uid_map", map);
    snprintf(map, sizeof map, "%u 0 1\n", (unsigned)gid);
    write_file("/proc/self/gid_map", map);
    for (int cap = 0; cap <= 63; cap++) prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
    if (setresgid(gid, gid, gid) < 0 || setresuid(uid, uid, uid) < 0) die_setup("setresuid");
    struct __user_cap_header_struct hdr = { _LINUX_CAPABILITY_VERSION_3, 0 };
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    if (syscall(SYS_capset, &hdr, data) < 0) die_setup("capset");
}

#if defined(__x86_64__)
#define AUDIT_ARCH_NATIVE AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define AUDIT_ARCH_NATIVE AUDIT_ARCH_AARCH64
#else
#error "tempering-init supports x86_64 and aarch64"
#endif

/* Syscalls that no agent needs and that widen the kernel surface an escape would use. */
static const int denied[] = {
#ifdef SYS_kexec_load
    SYS_kexec_load,
#endif
#ifdef SYS_kexec_file_load
    SYS_kexec_file_load,
#endif
    SYS_init_module, SYS_finit_module, SYS_delete_module, SYS_reboot, SYS_swapon, SYS_swapoff,
    SYS_mount, SYS_umount2, SYS_pivot_root, SYS_unshare, SYS_setns, SYS_keyctl, SYS_add_key,
    SYS_request_key, SYS_bpf, SYS_perf_event_open, SYS_userfaultfd, SYS_open_by_handle_at,
    SYS_name_to_handle_at, SYS_acct, SYS_quotactl, SYS_syslog, SYS_vhangup, SYS_settimeofday,
    SYS_clock_settime, SYS_clock_adjtime, SYS_adjtimex, SYS_io_uring_setup, SYS_io_uring_enter,
    SYS_io_uring_register, SYS_fsopen, SYS_fsconfig, SYS_fsmount, SYS_fspick, SYS_move_mount,
    SYS_open_tree, SYS_mount_setattr, SYS_lookup_dcookie,
#ifdef SYS_iopl
    SYS_iopl, SYS_ioperm,
#endif
#ifdef SYS_uselib
    SYS_uselib,
#endif
};

/* Answered ENOSYS, as on kernels without them, so libraries fall back. Legacy AIO: each
 * io_setup reserves part of fs.aio-max-nr, one counter for the whole machine (a sandbox could
 * take it all and make the host's own io_setup fail). memfd_secret: each page it faults in is
 * taken out of the kernel's direct map of RAM, splitting the huge pages around it for good
 * (one 256 MiB sandbox broke 13 GiB of 1 GiB mappings into small ones: more TLB misses for
 * everything on the host until a reboot), which no memory limit bounds. */
#ifndef SYS_memfd_secret
#define SYS_memfd_secret 447
#endif
#ifndef SO_ATTACH_BPF
#define SO_ATTACH_BPF 50
#endif
#ifndef SO_ATTACH_REUSEPORT_CBPF
#define SO_ATTACH_REUSEPORT_CBPF 51
#endif
#ifndef SO_ATTACH_REUSEPORT_EBPF
#define SO_ATTACH_REUSEPORT_EBPF 52
#endif
static const int no_aio[] = {
    SYS_io_setup, SYS_io_destroy, SYS_io_submit, SYS_io_cancel, SYS_io_getevents,
#ifdef SYS_io_pgetevents
    SYS_io_pgetevents,
#endif
    SYS_memfd_secret,
};

/* The only socket families a sandbox may create: each is confined by the sandbox's network
 * namespace (or is a socket between its own processes). Everything else is refused, known or
 * not: AF_VSOCK reaches the hypervisor and other guests' sandboxes with no namespace around it,
 * AF_ALG is the whole kernel crypto API, AF_BLUETOOTH and the old protocol families (X.25,
 * AppleTalk, RDS, TIPC...) are rarely namespaced and a long list of kernel bugs. AF_NETLINK
 * too: its queued messages are charged to no memory cgroup and to no machine-wide ceiling (a
 * sandbox of 128 MiB pinned 4 GiB in NETLINK_USERSOCK queues, and any protocol's unread
 * replies pin a receive buffer per socket); what the sandbox's network needs, the init set up
 * before this filter. Tools fall back to /proc (ss, glibc's address checks). */
static const uint32_t socket_families[] = { AF_UNIX, AF_INET, AF_INET6 };

#define STMT(code, k) ((struct sock_filter)BPF_STMT(code, k))
#define JUMP(code, k, jt, jf) ((struct sock_filter)BPF_JUMP(code, k, jt, jf))

enum { N_DENIED = sizeof denied / sizeof denied[0], N_AIO = sizeof no_aio / sizeof no_aio[0] };
enum { N_FAMILIES = sizeof socket_families / sizeof socket_families[0] };
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
/* Ways into another process of the same uid, refused in a "notrace" sandbox. */
static const int untraceable[] = { SYS_pidfd_getfd, SYS_process_vm_readv, SYS_process_vm_writev };
enum { N_UNTRACEABLE = sizeof untraceable / sizeof untraceable[0] };

/* 2 instructions per denied or AIO call, 8 around them, 6 for ioctl, 7 for clone3 and clone,
 * 7 for socket's protocol, 10 for socket filters, 10 for seccomp filters, 5 + one per family
 * for socket and socketpair, 2 per untraceable call and 6 for ptrace. */
enum { FILTER_MAX = 2 * (N_DENIED + N_AIO + N_UNTRACEABLE) + N_FAMILIES + 62 };

/* The seccomp program every command runs under (`notrace`: keeping processes out of one
 * another); returns its length. */
static int build_filter(struct sock_filter *prog, int notrace) {
    enum { N = N_DENIED };
    int n = 0;
    const uint32_t ns_flags = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER |
                              CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWCGROUP;
    prog[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_NATIVE, 1, 0);
    prog[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
    prog[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
#if defined(__x86_64__)
    /* x32 system calls alias the 64-bit ones with a high bit: refuse them outright. */
    prog[n++] = JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1);
    prog[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
#endif
    for (int i = 0; i < N; i++) {
        prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)denied[i], 0, 1);
        prog[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
    }
    for (int i = 0; i < (int)N_AIO; i++) {
        prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)no_aio[i], 0, 1);
        prog[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS);
    }
    if (notrace) {
        for (int i = 0; i < (int)N_UNTRACEABLE; i++) {
            prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)untraceable[i], 0, 1);
            prog[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
        }
        /* ptrace: no attaching to a process that did not ask for it. Other requests need a
         * tracee, which only PTRACE_TRACEME (a child asking its parent) can then make. The
         * low 32 bits of the request are compared: the kernel's full comparison matches less. */
        prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ptrace, 0, 5);
        prog[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0]));
        prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, PTRACE_ATTACH, 1, 0);
        prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, PTRACE_SEIZE, 0, 1);
        prog[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
        prog[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    }
    /* No BPF programs of the sandbox's own: socket filters (classic or eBPF) and seccomp
     * filters are JIT-compiled into memory that comes out of one machine-wide budget
     * (net.core.bpf_jit_limit) and no memory cgroup; one sandbox that filled it (11,709
     * socket filters) left every new sandbox unable to install its own seccomp filter, and
     * every unprivileged process on the host too. The init and the zygote install theirs
     * before this filter applies. */
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_setsockopt, 0, 8);
    prog[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1]));
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SOL_SOCKET, 0, 6);
    prog[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2]));
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SO_ATTACH_FILTER, 3, 0);
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SO_ATTACH_BPF, 2, 0);
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SO_ATTACH_REUSEPORT_CBPF, 1, 0);
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SO_ATTACH_REUSEPORT_EBPF, 0, 1);
    prog[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
    prog[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_seccomp, 0, 3);
    prog[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0]));
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SECCOMP_SET_MODE_FILTER, 0, 1);
    prog[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
    prog[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_prctl, 0, 3);
    prog[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0]));
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, PR_SET_SECCOMP, 0, 1);
    prog[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
    prog[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    /* socket: no ICMP datagram ("ping") sockets, whatever the namespace's ping_group_range
     * (the engine opens it to every group in a container's): their queues are charged to no
     * memory cgroup and to no machine-wide ceiling (a 128 MiB container pinned 2.1 GiB). */
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_socket, 0, 5);
    prog[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2]));
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, IPPROTO_ICMP, 2, 0);
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, IPPROTO_ICMPV6, 1, 0);
    prog[n++] = JUMP(BPF_JMP | BPF_JA, 1, 0, 0);
    prog[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EACCES);
    prog[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    /* socket and socketpair: the family (args[0]) must be one of socket_families. */
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_socket, 1, 0);
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_socketpair, 0, N_FAMILIES + 3);
    prog[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0]));
    for (int i = 0; i < (int)N_FAMILIES; i++)
        prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, socket_families[i], N_FAMILIES - i, 0);
    prog[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EAFNOSUPPORT);
    prog[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    /* btrfs ioctls (type 0x94): a nested subvolume or snapshot would escape the volume's quota. */
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ioctl, 0, 5);
    prog[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1]));
    prog[n++] = STMT(BPF_ALU | BPF_AND | BPF_K, 0xff00);
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x9400, 0, 1);
    prog[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
    prog[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    /* clone3 passes its flags in memory that a filter cannot read: make libc fall back to clone. */
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1);
    prog[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS);
    /* clone: new namespaces are refused; threads and processes are fine. */
    prog[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 3);
    prog[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0]));
    prog[n++] = JUMP(BPF_JMP | BPF_JSET | BPF_K, ns_flags, 0, 1);
    prog[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
    prog[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    return n;
}

static void install_seccomp(int notrace) {
    struct sock_filter prog[FILTER_MAX];
    int n = build_filter(prog, notrace);
    struct sock_fprog fprog = { (unsigned short)n, prog };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) die_setup("no_new_privs");
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog) < 0) die_setup("seccomp");
}

/* In a "notrace" sandbox: no command may open a file below /proc for writing (another
 * process's /proc/PID/mem, which a process of the same uid may otherwise write). A Landlock
 * domain of init's, which every command inherits: writing stays allowed below every other
 * entry of /. Magic links (/dev/stdout, /proc/self/fd/N) reach their target, whose own path
 * is what Landlock judges. Landlock missing: the sandbox does not start (fail closed). */
static void forbid_proc_writes(void) {
    if (landlock_abi() < 1)
        die_setup("Landlock, which a grading sandbox needs to keep its processes apart "
                  "(Linux 5.13 or later, with landlock in the kernel's lsm= list; "
                  "`tempering doctor` checks it)");
    uint64_t rights = LANDLOCK_ACCESS_FS_WRITE_FILE;
    struct ruleset_attr attr = { .handled_access_fs = rights };
    int ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, sizeof(uint64_t), 0);
    if (ruleset < 0) die_setup("landlock_create_ruleset");
    /* a link among /'s entries (/bin -> usr/bin) needs no rule: its target has one */
    if (grant_siblings(ruleset, "/", "proc", rights, rights) < 0) die_setup("landlock rules for /");
    if (enter_domain(ruleset) < 0) die_setup("landlock_restrict_self");
}

/* ---------- process trees ---------- */

struct proc { pid_t pid, ppid; };
static struct proc procs[MAX_PROCS];

static int scan_procs(void) {
    DIR *d = opendir("/proc");
    int n = 0;
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < MAX_PROCS) {
        char path[64], buf[512];
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 1) continue;
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t len = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (len <= 0) continue;
        buf[len] = 0;
        char *rp = strrchr(buf, ')'); /* comm may hold spaces and parentheses */
        if (!rp) continue;
        char state;
        int ppid;
        if (sscanf(rp + 1, " %c %d", &state, &ppid) != 2) continue;
        procs[n].pid = pid;
        procs[n].ppid = ppid;
        n++;
    }
    closedir(d);
    return n;
}

static int is_marked(const struct job *j, pid_t pid) {
    for (int i = 0; i < j->nmarked; i++)
        if (j->marked[i] == pid) return 1;
    return 0;
}

/* Collect (into out) the descendants of root; with a job in "since mark" mode, subtrees rooted
 * at a marked process and the job's main process itself are kept. */
static int collect(int nprocs, pid_t root, const struct job *j, int since_mark, pid_t *out, int nout) {
    pid_t stack[4096];
    int sp = 0;
    stack[sp++] = root;
    while (sp > 0) {
        pid_t parent = stack[--sp];
        for (int i = 0; i < nprocs; i++) {
            if (procs[i].ppid != parent) continue;
            pid_t pid = procs[i].pid;
            int keep = since_mark && (pid == j->main || is_marked(j, pid));
            if (since_mark && is_marked(j, pid) && pid != j->main) continue; /* older: spare it */
            if (!keep && nout < MAX_PROCS) out[nout++] = pid;
            if (sp < 4096) stack[sp++] = pid;
        }
    }
    return nout;
}

static pid_t victims[MAX_PROCS];

static void kill_tree(struct job *j, int sig, int since_mark) {
    /* Killed processes cannot fork, and the children of killed ones are reparented to the
     * shepherd: a few rounds reach a fixed point even against a fork loop. */
    for (int round = 0; round < 64; round++) {
        int nprocs = scan_procs();
        int n = collect(nprocs, j->shepherd, j, since_mark, victims, 0);
        if (n == 0) break;
        for (int i = 0; i < n; i++) kill(victims[i], sig);
        if (sig != SIGKILL) break;
    }
}

static void mark(struct job *j) {
    int nprocs = scan_procs();
    int n = collect(nprocs, j->shepherd, j, 0, victims, 0);
    free(j->marked);
    j->marked = malloc(sizeof(pid_t) * (size_t)(n ? n : 1));
    j->nmarked = 0;
    if (!j->marked) return;
    memcpy(j->marked, victims, sizeof(pid_t) * (size_t)n);
    j->nmarked = n;
}

static void reap(void);

/* Every process of the sandbox but this one: kill(-1) from PID 1 reaches each process of its
 * pid namespace that it may signal (all run as its user), its commands' shepherds and the
 * daemons they left alike. Rounds until none is left, even against a fork loop; reaping as it
 * goes reports each killed command's exit. */
static void kill_all(void) {
    for (int round = 0; round < 2000; round++) {
        kill(-1, SIGKILL);
        reap();
        if (kill(-1, 0) < 0 && errno == ESRCH) return;
        usleep(500);
    }
}

static struct job *find_job(uint32_t id) {
    for (int i = 0; i < njobs; i++)
        if (jobs[i].id == id) return &jobs[i];
    return NULL;
}

/* ---------- commands ---------- */

static void reset_signals(void) {
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
}

static _Noreturn void run_command(int fds[3], char *cwd, char **argv, char **envp) {
    setsid();
    for (int i = 0; i < 3; i++)
        if (dup2(fds[i], 100 + i) < 0) _exit(127);
    for (int i = 0; i < 3; i++)
        if (dup2(100 + i, i) < 0) _exit(127);
    syscall(SYS_close_range, 3, ~0U, 0);
    reset_signals();
    if (chdir(cwd) < 0) {
        dprintf(2, "tempering: cannot enter working directory %s: %s\n", cwd, strerror(errno));
        _exit(127);
    }
    environ = envp;
    execvp(argv[0], argv);
    int err = errno;
    dprintf(2, "tempering: cannot execute %s: %s\n", argv[0], strerror(err));
    _exit(err == ENOENT ? 127 : 126);
}

/* cgroup.procs of the commands' memory cgroup, opened by the host (MSG_CGROUP; -1 where it
 * sent none): every command enters it before it runs, so that the OOM killer, at its memory
 * limit, chooses among commands only and never takes this init. The host opened it, and the
 * kernel judges a move by the opener's credentials. */
static int COMMANDS_CG = -1;

static _Noreturn void shepherd(int fds[3], char *cwd, char **argv, char **envp) {
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    if (COMMANDS_CG >= 0 && write(COMMANDS_CG, "0", 1) < 0) {
        dprintf(fds[2], "tempering: cannot enter the commands' cgroup: %s\n", strerror(errno));
        _exit(126);
    }
    pid_t child = fork();
    if (child < 0) {
        dprintf(fds[2], "tempering: cannot start process: %s (is the sandbox's pids limit "
                        "reached?)\n", strerror(errno));
        _exit(126);
    }
    if (child == 0) run_command(fds, cwd, argv, envp);
    for (int i = 0; i < 3; i++) close(fds[i]);
    /* The shepherd's SIGCHLD must stay default (not ignored) for waitpid to work. */
    int status = 0;
    for (;;) {
        pid_t pid = waitpid(-1, &status, 0);
        if (pid == child) break;
        if (pid < 0 && errno != EINTR) _exit(126);
    }
    if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
    /* Die the way the command died, so init reads the same status; no core files. */
    struct rlimit none = { 0, 0 };
    setrlimit(RLIMIT_CORE, &none);
    int sig = WTERMSIG(status);
    reset_signals();
    raise(sig);
    _exit(128 + sig);
}

static void handle_exec(struct header *h, char *payload, size_t len, int fds[3]) {
    /* payload: cwd\0 argv[0..nargs)\0 env[0..nenv)\0 */
    size_t nstr = 1 + h->a + h->b;
    char **strs = calloc(nstr + 2, sizeof(char *));
    char *p = payload, *end = payload + len;
    for (size_t i = 0; i < nstr; i++) {
        if (p >= end) { free(strs); send_msg(MSG_FAIL, h->id, EINVAL, "malformed request"); return; }
        strs[i] = p;
        p += strnlen(p, (size_t)(end - p)) + 1;
    }
    char *cwd = strs[0];
    char **argv = strs + 1;
    char **envp = calloc(h->b + 1, sizeof(char *));
    memcpy(envp, strs + 1 + h->a, h->b * sizeof(char *));
    char *argv_buf[h->a + 1];
    memcpy(argv_buf, argv, h->a * sizeof(char *));
    argv_buf[h->a] = NULL;
    if (njobs >= MAX_JOBS) {
        send_msg(MSG_FAIL, h->id, EAGAIN, "too many concurrent commands in this sandbox");
    } else {
        pid_t pid = fork();
        if (pid < 0) {
            char text[160];
            snprintf(text, sizeof text, "cannot start process: %s (is the sandbox's pids limit reached?)",
                     strerror(errno));
            send_msg(MSG_FAIL, h->id, (uint32_t)errno, text);
        } else if (pid == 0) {
            close(CTL_FD);
            shepherd(fds, cwd, argv_buf, envp);
        } else {
            jobs[njobs++] = (struct job){ h->id, pid, 0, NULL, 0 };
        }
    }
    free(envp);
    free(strs);
}

static void job_main_pid(struct job *j) {
    /* The main process is the shepherd's first child; learn it lazily for MARK/KILL. */
    if (j->main) return;
    int n = scan_procs();
    for (int i = 0; i < n; i++)
        if (procs[i].ppid == j->shepherd) { j->main = procs[i].pid; return; }
}

static void handle_message(void) {
    int fds[3] = { -1, -1, -1 }, nfds = 0;
    ssize_t n = recv_with_fds(CTL_FD, msgbuf, MAX_MSG, fds, 3, &nfds);
    if (n == 0) _exit(0); /* the host closed the sandbox: PID 1 exits, the kernel kills the rest */
    if (n < 0) { if (errno == EINTR || errno == EAGAIN) return; _exit(1); }
    if ((size_t)n < sizeof(struct header)) goto out;
    struct header h;
    memcpy(&h, msgbuf, sizeof h);
    msgbuf[n] = 0;
    if (h.type == MSG_EXEC && nfds == 3) {
        handle_exec(&h, msgbuf + sizeof h, (size_t)n - sizeof h, fds);
    } else if (h.type == MSG_KILL || h.type == MSG_MARK) {
        struct job *j = find_job(h.id);
        if (j) {
            job_main_pid(j);
            if (h.type == MSG_KILL) kill_tree(j, (int)h.a, (int)h.b);
            else mark(j);
        }
        if (h.type == MSG_MARK) send_msg(MSG_MARKED, h.id, 0, NULL);
    } else if (h.type == MSG_KILL_ALL) {
        kill_all();
        send_msg(MSG_MARKED, h.id, 0, NULL);
    } else if (h.type == MSG_CGROUP && nfds == 1) {
        if (COMMANDS_CG >= 0) close(COMMANDS_CG);
        COMMANDS_CG = fds[0]; /* close-on-exec: no command holds it */
        nfds = 0;
        send_msg(MSG_MARKED, h.id, 0, NULL);
    }
out:
    for (int i = 0; i < nfds; i++) close(fds[i]);
}

static void reap(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < njobs; i++) {
            if (jobs[i].shepherd != pid) continue;
            send_msg(MSG_EXIT, jobs[i].id, (uint32_t)status, NULL);
            free(jobs[i].marked);
            jobs[i] = jobs[--njobs];
            break;
        }
    }
}

/* The control socket: an inherited fd (bubblewrap passes one), or "unix:PATH", a listening
 * SOCK_SEQPACKET socket the host bound into the container, which accepts this one connection. */
static int control_channel(const char *arg) {
    if (strncmp(arg, "unix:", 5) != 0) return atoi(arg);
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    if (strlen(arg + 5) >= sizeof addr.sun_path) { fprintf(stderr, "control path too long\n"); exit(2); }
    strcpy(addr.sun_path, arg + 5);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        fprintf(stderr, "tempering-init: cannot connect to %s: %s\n", arg + 5, strerror(errno));
        exit(2);
    }
    return fd;
}

/* Run by the host (root), never inside: make PATH read-only in the mount namespace of PID
 * (a sandbox's PID 1), for everything that runs there from now on. A bind of the directory
 * onto itself, remounted read-only; PATH is resolved there without following a link at its
 * end, and what runs in the sandbox (no CAP_SYS_ADMIN over that namespace, mount refused by
 * seccomp) cannot undo it. */
/* Run by the host: `paths` (absolute, as the sandbox sees them) made read-only in the sandbox's
 * mount namespace, for everything that runs there from now on: each a bind of itself,
 * remounted read-only. Nothing inside holds the capability to undo it; a file so bound cannot
 * be removed or renamed over either. A directory is reached through its own descriptor, a file
 * through its parent's, neither through a symbolic link. */
static int seal_one(const char *path, int readonly) {
    int at = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (at < 0 || fstat(at, &st) < 0) { perror(path); return 1; }
    const char *name = ".";
    char parent[4096];
    if (S_ISREG(st.st_mode)) {
        const char *slash = strrchr(path, '/');
        if (!slash || !slash[1] || (size_t)(slash - path) >= sizeof parent) {
            fprintf(stderr, "%s: not an absolute file path\n", path);
            return 1;
        }
        memcpy(parent, path, (size_t)(slash - path));
        parent[slash - path] = 0;
        name = slash + 1;
        close(at);
        at = open(parent[0] ? parent : "/", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    } else if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "%s: neither a directory nor a regular file\n", path);
        return 1;
    }
    if (at < 0 || fchdir(at) < 0) { perror(path); return 1; }
    close(at);
    if (mount(name, name, NULL, MS_BIND | MS_REC, NULL) < 0) { perror("bind"); return 1; }
    if (S_ISDIR(st.st_mode)) {
        /* "." was the directory under the new mount: look it up again to reach the bind. */
        int top = open(path, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (top < 0 || fchdir(top) < 0) { perror(path); return 1; }
        close(top);
    }
    if (readonly && mount(NULL, name, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID |
                          MS_NODEV, NULL) < 0) { perror("remount read-only"); return 1; }
    return 0;
}

static int seal_paths(const char *pid, int n, char **paths) {
    char ns[64];
    snprintf(ns, sizeof ns, "/proc/%s/ns/mnt", pid);
    int nsfd = open(ns, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0 || setns(nsfd, CLONE_NEWNS) < 0) { perror(ns); return 1; }
    /* After "--pin", directories bound onto themselves and left writable: a mount point
     * cannot be renamed or removed, so the way to a sealed file below them stays put. */
    int readonly = 1;
    for (int i = 0; i < n; i++) {
        if (strcmp(paths[i], "--pin") == 0) { readonly = 0; continue; }
        if (seal_one(paths[i], readonly) != 0) return 1;
    }
    return 0;
}

/* Run by the host, for a container: its devpts, which the engine mounted without a maximum,
 * remounted in its mount namespace with `options` (the engine's own, and a maximum). */
static int limit_ptys(const char *pid, const char *options) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%s/ns/mnt", pid);
    int ns = open(path, O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNS) < 0) { perror(path); return 1; }
    if (mount(NULL, "/dev/pts", NULL, MS_REMOUNT | MS_NOSUID | MS_NOEXEC, options) < 0) {
        perror("remount /dev/pts");
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "--seal") == 0) return seal_paths(argv[2], argc - 3, argv + 3);
    if (argc == 4 && strcmp(argv[1], "--limit-ptys") == 0) return limit_ptys(argv[2], argv[3]);
    if ((argc == 2 || argc == 3) && strcmp(argv[1], "--seccomp-filter") == 0) {
        /* The program, as raw struct sock_filter records, for a process that must install the
         * same filter itself (the grading zygote's children); "notrace" as in a sandbox. */
        if (argc == 3 && strcmp(argv[2], "notrace") != 0) {
            fprintf(stderr, "usage: tempering-init --seccomp-filter [notrace]\n");
            return 2;
        }
        struct sock_filter prog[FILTER_MAX];
        int n = build_filter(prog, argc == 3);
        return write(1, prog, (size_t)n * sizeof prog[0]) == (ssize_t)(n * sizeof prog[0]) ? 0 : 1;
    }
    if (argc != 8 && argc != 9) {
        fprintf(stderr, "usage: tempering-init CONTROL_FD DISK_BYTES|mount:FD WORKDIR UID GID "
                        "WRITABLE_DIRS|- notrace|- [NET_RULES] "
                        "(run by the sandbox)\n");
        return 2;
    }
    if (strcmp(argv[7], "notrace") != 0 && strcmp(argv[7], "-") != 0) {
        fprintf(stderr, "tempering-init: the tracing argument must be notrace or -, not %s\n",
                argv[7]);
        return 2;
    }
    int notrace = strcmp(argv[7], "notrace") == 0;
    CTL_FD = control_channel(argv[1]);
    if (strncmp(argv[2], "mount:", 6) == 0) { /* an idmapped volume, passed as this fd */
        setup_volume(atoi(argv[2] + 6), argv[3], argv[6]);
    } else {
        unsigned long long disk = strtoull(argv[2], NULL, 10);
        /* 0: the host bound a volume there already */
        if (disk > 0) setup_disk(disk, argv[3], argv[6]);
    }
    if (argc == 9) setup_network(argv[8]);    /* before the capabilities go */
    /* In a container the engine already made us the unprivileged user, with no capability
     * (and the engine mounted the container's devpts). */
    if (geteuid() == 0) {
        setup_ptys();
        setup_ipc();
        become_user((uid_t)atoi(argv[4]), (gid_t)atoi(argv[5]));
    }
    /* Commands run as the same user: without this they could ptrace the fork server. */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    if (notrace) forbid_proc_writes();
    install_seccomp(notrace);

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) die_setup("signalfd");
    send_msg(MSG_READY, 0, 0, NULL);

    struct pollfd pfd[2] = { { CTL_FD, POLLIN, 0 }, { sfd, POLLIN, 0 } };
    for (;;) {
        if (poll(pfd, 2, -1) < 0) continue;
        if (pfd[1].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) > 0) {}
            reap();
        }
        if (pfd[0].revents & (POLLIN | POLLHUP | POLLERR)) handle_message();
    }
}
