"""The grading zygote, PID 1 of one sandbox: each grading is a fresh sandbox forked from it.

A grading in a sandbox of its own pays for a fresh interpreter (and the ``typing`` import most
solutions make) every time. The zygote pays once: it runs as PID 1 of a bubblewrap sandbox
(with CAP_SYS_ADMIN in that sandbox's user namespace, like the init), imports the launcher and
the common standard modules, and then serves GRADE requests from the host. For each one it
unshares a new pid namespace for its next child (taking its own back right after) and forks
the **grading process**, PID 1 of that namespace, which

1. unshares new mount, net, ipc and uts namespaces and mounts one fresh size-limited tmpfs,
   bound at the workdir, /tmp and /dev/shm (nothing of an earlier grading is there, and nothing
   else is writable: the rest of the system and /dev are read-only), and its own /proc;
2. tells the host its pid (SCM_CREDENTIALS: the kernel translates it), waits while the host
   puts it in a cgroup of its own and writes the files, seals what the host names read-only
   (it still holds the zygote's capabilities over its own mount namespace),
3. and, before it reads a byte of the configuration, becomes the unprivileged user in a
   nested user namespace with no capability, sets no_new_privs, takes a Landlock domain in
   which nothing below /proc opens for writing and installs the seccomp filter of a grading
   sandbox's init (read from ``init --seccomp-filter notrace``: no process of the grading
   reaches into another, as in any grading sandbox), then runs the plain runner on the
   configuration the host sends, reporting on the same socket. With process isolation it
   first forks the **solver**, the tested code's process (``inside_boundary.py``), into the
   same cgroup, in a mount namespace of its own where the tests directory is empty.

The zygote's interpreter loads ``nestguard`` (``sandbox/nestguard.c``, preloaded): every
program a grading's tests start runs in a Landlock domain of its own, out of the others'
reach; a zygote whose ``python3`` did not load it says so and serves nothing.

The zygote reaps each grading and tells the host its exit status on a socket of its own, which
no grading holds. Nothing the agent wrote is read before step 3, and the zygote's own memory is
never touched by a grading (fork). A grading has no ptys: the zygote's /dev has no devpts
(bubblewrap makes none here), since a devpts shared by the gradings, which share the zygote's
uid, would let one open another's terminal, and one of its own would cost 1.5 ms of CPU a
grading; a task whose tests need a terminal runs under the pytest runner, in a sandbox of its
own. Runs with the sandbox's ``python3 -I -B``; stdlib only.
"""

# Besides what it uses, the zygote imports what solutions and tests commonly import (the
# F401 ones), once, so that no grading pays for them.
import ast  # noqa: F401 - the launcher compiles the hidden tests with it
import collections  # noqa: F401
import contextlib
import ctypes
import errno
import functools  # noqa: F401
import gc
import importlib.util
import itertools  # noqa: F401
import json  # noqa: F401 - the boundary's wire
import marshal
import math  # noqa: F401
import os
import re  # noqa: F401
import resource
import select
import signal
import socket
import string  # noqa: F401
import struct
import sys
import typing  # noqa: F401

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import inside_launcher as launcher  # noqa: E402 - from the same read-only directory

LIBC = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
MNT_DETACH = 2
MS_RDONLY, MS_REMOUNT = 1, 32
DISK = "/.tempering/disk"


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source, target, fstype, flags, data=None):
    check(LIBC.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                     ctypes.c_ulong(flags), data and data.encode()), f"mount {target}")


def fresh_storage(disk_bytes, workdir):
    """One tmpfs of disk_bytes (one inode per KiB) bound at the workdir, /tmp and /dev/shm:
    the only places a grading can write (bubblewrap made /dev itself read-only), all fresh and
    all in one disk budget. The tmpfs itself is then detached: only the three binds reach it."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    options = f"size={disk_bytes},nr_inodes={max(disk_bytes >> 10, 1024)},mode=0755"
    mount("tmpfs", DISK, "tmpfs", MS_NOSUID | MS_NODEV, options)
    for name, target, mode in (("w", workdir, 0o755), ("t", "/tmp", 0o1777),
                               ("s", "/dev/shm", 0o1777)):
        os.mkdir(f"{DISK}/{name}")
        os.chmod(f"{DISK}/{name}", mode)
        mount(f"{DISK}/{name}", target, None, MS_BIND)
    check(LIBC.umount2(DISK.encode(), MNT_DETACH), f"detach {DISK}")


def seal(channel, workdir):
    """Once the host has written the files, make the paths it names (the hidden tests'
    directory, the task's protected files) read-only for the grading: each a bind of itself,
    remounted read-only (done here while this process still holds the zygote's capabilities in
    its own mount namespace; the grading, in a user namespace of its own without capabilities,
    cannot undo it; a file so bound cannot be removed or replaced); and pin the directories
    above them (``+PATH``: a bind of itself, left writable, since a mount point cannot be
    renamed away). Nothing the tested code starts can change what the tests read. Answers
    ``sealed`` (or the error) to ``seal PATHS``; to ``none`` (nothing to seal), nothing."""
    message = channel.recv(1 << 16)
    if not message.startswith(b"seal "):
        return
    try:
        for raw in message[5:].split(b"\0"):
            pinned = raw.startswith(b"+")
            path = os.path.realpath(raw[pinned:].decode())
            if not path.startswith(workdir.rstrip("/") + "/"):
                raise OSError(f"{path} is outside the workdir")
            if os.path.isdir(path) or os.path.isfile(path) and not pinned:
                mount(path, path, None, MS_BIND | MS_REC)
                if not pinned:
                    mount(None, path, None,
                          MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        channel.send(b"sealed")
    except OSError as exc:
        channel.send(f"failed: {exc}".encode())


# Every grading of one zygote runs as the zygote's host uid, and so shares that uid's per-user
# kernel counters: each grading gets a sixteenth of each it can be given a share of.
SHARES = 16
# (this user namespace's own limit, the host's per-user limit it is charged against)
USER_COUNTERS = (("max_inotify_instances", "fs/inotify/max_user_instances"),
                 ("max_inotify_watches", "fs/inotify/max_user_watches"),
                 ("max_fanotify_groups", "fs/fanotify/max_user_groups"),
                 ("max_fanotify_marks", "fs/fanotify/max_user_marks"))


def counter_shares():
    """[(this user namespace's limit, the share to set it to)] of each per-user counter the
    kernel has: read once, in the zygote, for every grading."""
    shares = []
    for own, host_limit in USER_COUNTERS:
        try:
            with open(f"/proc/sys/{host_limit}") as f:
                shares.append((own, max(int(f.read()) // SHARES, 1)))
        except OSError:  # the kernel has no such counter
            continue
    return shares


SHARE_OF = []  # counter_shares(), once the zygote started


def limit_user_counters():
    """Bound this grading's share of its uid's counters: the ucount limits of its own user
    namespace (writable while it holds CAP_SYS_RESOURCE there), and the per-user rlimits."""
    for own, share in SHARE_OF:
        with open(f"/proc/sys/user/{own}", "w") as f:
            f.write(str(share))
    # At least one message queue of the default size (10 messages of 8 KiB) each.
    for limit, least in ((resource.RLIMIT_MSGQUEUE, 96 << 10), (resource.RLIMIT_SIGPENDING, 1)):
        soft, _ = resource.getrlimit(limit)
        share = max(soft // SHARES, least) if soft != resource.RLIM_INFINITY else 1 << 16
        resource.setrlimit(limit, (share, share))


# What a sandbox's init sets in its IPC namespace (init.c's setup_ipc), here in each
# grading's: SysV objects no process holds would be memory of the cgroup no kill frees.
IPC_LIMITS = (("shm_rmid_forced", "1"), ("msgmni", "16"), ("sem", "250 8000 32 32"))


def limit_ipc():
    for name, value in IPC_LIMITS:
        with open(f"/proc/sys/kernel/{name}", "w") as f:
            f.write(value)


def forbid_proc_writes():
    """What the init does in a grading sandbox (``forbid_proc_writes`` in init.c): a Landlock
    domain in which nothing below /proc opens for writing (another process's /proc/PID/mem),
    everything else as before; inherited by everything the grading starts."""
    write_file = 1 << 1  # LANDLOCK_ACCESS_FS_WRITE_FILE
    attr = struct.pack("=Q", write_file)
    ruleset = LIBC.syscall(444, attr, len(attr), 0)  # landlock_create_ruleset
    if ruleset < 0:
        check(-1, "Landlock (needed to keep a grading's processes apart)")
    try:
        for name in os.listdir("/"):
            if name == "proc":
                continue
            try:
                fd = os.open(f"/{name}", os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            rule = struct.pack("=Qi", write_file, fd)  # landlock_path_beneath_attr (packed)
            added = LIBC.syscall(445, ruleset, 1, rule, 0)  # LANDLOCK_RULE_PATH_BENEATH
            os.close(fd)
            if added < 0 and ctypes.get_errno() not in (errno.EINVAL, errno.EBADFD):
                check(-1, f"landlock_add_rule /{name}")
        check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        check(LIBC.syscall(446, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def become_user(uid, gid, seccomp):
    """What the init does for itself: nested user namespace, no capability, no write below
    /proc, seccomp (its ``notrace`` program: see ``zygote._bundle``)."""
    check(LIBC.unshare(CLONE_NEWUSER), "unshare user namespace")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} 0 1\n"),
                       ("gid_map", f"{gid} 0 1\n")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    limit_user_counters()
    for cap in range(64):
        LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = struct.pack("=Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)  # two empty __user_cap_data_struct
    check(LIBC.syscall(126, header, data), "capset")  # SYS_capset on x86_64
    check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    forbid_proc_writes()
    program = ctypes.create_string_buffer(seccomp, len(seccomp))
    fprog = SockFprog(len(seccomp) // 8, ctypes.addressof(program))
    check(LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def grading(channel, request, seccomp):
    """The grading process (PID 1 of its pid namespace); never returns."""
    try:
        check(LIBC.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
        fresh_storage(request["disk"], request["workdir"])
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        limit_ipc()
        creds = struct.pack("3i", os.getpid(), os.getuid(), os.getgid())
        channel.sendmsg([b"ready"], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds)])
        # The host moves this process into its cgroup, writes the files and has them sealed,
        # then sends the configuration's length: what is forked from here on is in the cgroup.
        seal(channel, request["workdir"])
        size = struct.unpack("=I", channel.recv(4))[0]
        uid, gid = request["uid"], request["gid"]
        hidden, hide = request.get("solver"), request.get("hide")
        if hidden is not None and hide:  # the tested code's own process (inside_boundary.py),
            launcher.SOLVER.append(launcher.boundary_module.fork_solver(  # the tests out of view
                request["workdir"], before=lambda: solver_user(hidden, uid, gid, seccomp))[0])
        become_user(uid, gid, seccomp)
        if hidden is not None and not hide:  # nothing there but empty placeholders: the
            launcher.SOLVER.append(launcher.boundary_module.fork_solver(  # grading's user will do
                request["workdir"])[0])
        os.chdir(request["workdir"])
        # (the configuration holds the hidden tests: it may not fit one datagram)
        config = marshal.loads(launcher.boundary_module.exactly(channel, size))
        for name in ("ctypes", "LIBC", "SockFprog"):  # the tested code must import ctypes anew
            globals().pop(name, None)
        launcher.run_plain(config, channel.fileno())
    except BaseException as exc:  # the host sees a grading that never reported
        os.write(2, f"tempering-zygote: grading failed: {exc!r}\n".encode())
        os._exit(1)
    os._exit(0)


def solver_user(hidden, uid, gid, seccomp):
    """The solver's namespaces: a mount namespace of its own in which the hidden tests'
    directory ``hidden`` is an empty read-only directory (it never sees their data files, or
    the placeholders), then the same user, capabilities and seccomp as the grading's."""
    check(LIBC.unshare(CLONE_NEWNS), "unshare the solver's mount namespace")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    os.makedirs(hidden, exist_ok=True)
    mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY,
          "size=4096,nr_inodes=1,mode=0555")
    become_user(uid, gid, seccomp)


def serve(control, seccomp):
    """Fork a grading for each request, PID 1 of a pid namespace of its own (the zygote's
    next child is, once it unshares one; it takes its own back after the fork), and tell each
    grading's exit status on the status socket that came with its request once it is reaped:
    the zygote is its parent, so the tested code cannot speak for it."""
    own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wake-up byte is what counts
    statuses = {}  # a grading's pid: the status socket its exit code goes to
    while True:
        ready, _, _ = select.select([control, wake_r], [], [])
        if wake_r in ready:
            reap(wake_r, statuses)
        if control not in ready:
            continue
        message, fds, _, _ = socket.recv_fds(control, 4096, 2)
        if not message:
            return
        request = marshal.loads(message)
        channel = socket.socket(fileno=fds[0])
        status = socket.socket(fileno=fds[1])
        check(LIBC.unshare(CLONE_NEWPID), "unshare a pid namespace")
        pid = os.fork()
        if pid == 0:
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for sock in (control, status, *statuses.values()):
                    sock.close()  # the tested code must not speak for its parent
                for fd in (own, wake_r, wake_w):
                    os.close(fd)
            except BaseException as exc:
                os.write(2, f"tempering-zygote: {exc!r}\n".encode())
                os._exit(1)
            grading(channel, request, seccomp)  # never returns
        check(LIBC.setns(own, CLONE_NEWPID), "return to the zygote's pid namespace")
        channel.close()
        statuses[pid] = status


def reap(wake_r, statuses):
    """Tell the exit status of every grading that ended."""
    with contextlib.suppress(BlockingIOError):
        while os.read(wake_r, 4096):
            pass
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        status = statuses.pop(pid, None)
        if status is not None:
            with contextlib.suppress(OSError):
                status.send(struct.pack("i", os.waitstatus_to_exitcode(code)))
            status.close()


def main():
    control = socket.socket(fileno=int(sys.argv[1]))
    if not launcher.boundary_module.nested():
        control.send(b"error this python3 did not load the grader's nestguard.so (a libc other "
                     b"than glibc?), which keeps the programs the tests start apart")
        return
    with open(sys.argv[2], "rb") as f:  # the init's seccomp program, written by the host
        seccomp = f.read()
    SHARE_OF.extend(counter_shares())
    launcher.guard_module.preseal(os.path.dirname(launcher.__file__))  # once, for every grading
    launcher.guard_module.frame_readers()  # before the freeze, which folds them in
    launcher.guard_module.freeze([launcher.guard_module, launcher.compiling, launcher,
                                sys.modules[__name__]])
    launcher.guard_module.freeze_frame_handlers()
    # What is loaded now is never garbage: left to the collector, each grading's first
    # collection would walk (and, copy-on-write, copy) the whole inherited heap.
    gc.collect()
    gc.freeze()
    control.send(b"ready " + importlib.util.MAGIC_NUMBER.hex().encode())  # whose bytecode
    serve(control, seccomp)


if __name__ == "__main__":
    main()
