"""Kernel counters that sandboxes could share: one sandbox must not exhaust another's, nor the
host's. Each attack holds what it took in a live sandbox while a second sandbox (and the host)
asks for the same kind of thing; both backends, both storages."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import platform
import signal
import subprocess
import sys
import time

import pytest

from tempering.sandbox import Sandbox, open_sandbox
from tempering.sandbox.native import home
from tempering.sandbox.uids import uid_range

# Takes every instance of a per-user counter it can and holds them; prints how many it got
# and the errno that stopped it. {take} is a statement that takes one (raises OSError when
# refused), run until it fails.
HOG = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
held = []
def take():
    {take}
err = 0
while len(held) < 100000:
    try:
        take()
    except OSError as exc:
        err = exc.errno
        break
with open("/tmp/hog.out.tmp", "w") as f:
    f.write(f"{{len(held)}} {{err}}\n")
os.rename("/tmp/hog.out.tmp", "/tmp/hog.out")
time.sleep(120)
"""

INOTIFY = """fd = libc.inotify_init1(0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    held.append(fd)"""

# POSIX message queues: their bytes are charged to the user (RLIMIT_MSGQUEUE, 800 KiB by
# default: about nine default-sized queues).
MQUEUE = """name = f"/q{os.getpid()}-{len(held)}".encode()
    try:
        rt = ctypes.CDLL("librt.so.1", use_errno=True)
    except OSError:
        rt = libc
    fd = rt.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "mq_open")
    held.append(fd)"""

# Ptys: every devpts instance but the host's draws on one machine-wide count (kernel.pty.max less
# its reserve, 3,071 by default), so each sandbox mounts its own, with a maximum.
PTY = """held.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))"""

# Queued UDP datagrams that nothing reads, on the sandbox's own loopback: kernel memory that a
# cgroup v1 memory limit does not count unless its socket accounting is on, and that presses on
# the machine-wide udp_mem (the host's own datagrams start to drop). Stops at 256 MiB, or once
# the queues stop growing; prints the most the machine's UDP pages grew while it held them.
UDP_FLOOD = r"""
import os, socket, time
def pages():
    with open("/proc/net/sockstat") as f:
        for line in f:
            if line.startswith("UDP:"):
                words = line.split()
                return int(words[words.index("mem") + 1])
start, best, stale, held = pages(), 0, 0, []
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
tx.setblocking(False)
data = b"u" * 60000
try:
    while best < 65536 and stale < 50 and len(held) < 900:
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 24)
        rx.bind(("127.0.0.1", 0))
        held.append(rx)
        for _ in range(100):
            try:
                tx.sendto(data, rx.getsockname())
            except OSError:
                break
        grown = pages() - start
        best, stale = (grown, 0) if grown > best else (best, stale + 1)
except OSError:
    pass
print(best, len(held), flush=True)
"""

AIO = """ctx = ctypes.c_ulong(0)
    if libc.syscall(206, 4096, ctypes.byref(ctx)) != 0:  # io_setup on x86_64
        raise OSError(ctypes.get_errno(), "io_setup")
    held.append(ctx)"""


async def _hog(sb: Sandbox, take: str) -> tuple[int, int]:
    """Start the hog as a daemon of ``sb`` and wait until it holds all it could take."""
    await sb.write_file("hog.py", HOG.format(take=take))
    started = await sb.exec("python3 hog.py > /tmp/hog.log 2>&1 &", timeout=10)
    assert started.exit_code == 0, started
    for _ in range(200):
        r = await sb.exec("cat /tmp/hog.out 2>/dev/null; true", timeout=10)
        if r.stdout.strip():
            got, err = r.stdout.split()
            return int(got), int(err)
        await asyncio.sleep(0.05)
    log = (await sb.exec("cat /tmp/hog.log", timeout=10)).stdout
    raise AssertionError(f"the hog never reported: {log}")


async def _takes_one(sb: Sandbox, take: str) -> str:
    """Whether one more can be taken in ``sb`` ('ok', or the errno's name)."""
    script = ("import ctypes, errno, os\nlibc = ctypes.CDLL(None, use_errno=True)\nheld = []\n"
              f"def take():\n    {take}\ntry:\n    take()\n    print('ok')\n"
              "except OSError as exc:\n    print(errno.errorcode[exc.errno])\n")
    r = await sb.exec(["python3", "-c", script], timeout=20)
    assert r.exit_code == 0, r
    return r.stdout.strip()


@pytest.mark.parametrize("take", [INOTIFY, MQUEUE], ids=["inotify", "mqueue"])
async def test_one_sandbox_cannot_exhaust_anothers_per_user_counters(make_spec, take) -> None:
    async with open_sandbox(make_spec()) as hog, open_sandbox(make_spec()) as other:
        got, err = await _hog(hog, take)
        assert got > 0 and err in (errno.EMFILE, errno.ENOSPC, errno.ENOMEM), (got, err)
        assert await _takes_one(hog, take) != "ok"  # it does hold its whole share
        assert await _takes_one(other, take) == "ok"  # and the other sandbox still has its own
    if take == INOTIFY:
        fd = ctypes.CDLL(None, use_errno=True).inotify_init1(0)
        assert fd >= 0
        os.close(fd)


async def test_one_sandbox_cannot_take_every_pty(make_spec) -> None:
    async with open_sandbox(make_spec()) as hog, open_sandbox(make_spec()) as other:
        got, err = await _hog(hog, PTY)
        assert (got, err) == (32, errno.ENOSPC)  # its own devpts's maximum, no more
        assert await _takes_one(other, PTY) == "ok"
        fd = os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY)  # and the host keeps its own
        os.close(fd)


async def test_queued_socket_buffers_count_against_the_memory_limit(make_spec) -> None:
    async with open_sandbox(make_spec(memory_mb=64)) as sb:
        r = await sb.exec(["python3", "-c", UDP_FLOOD], timeout=60)
        assert r.exit_code in (0, -9, 137) or r.oom_killed, r
        if r.stdout.strip():
            grown, sockets = (int(x) for x in r.stdout.split())
            # Pages of the whole machine: the 64 MiB of the sandbox's socket limit, and some
            # slack for the rest of the machine (without the limit: 256 MiB, the flood's cap).
            assert grown * 4096 <= 96 << 20, (grown, sockets)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the probe uses x86_64 numbers")
async def test_legacy_aio_is_refused_and_the_host_keeps_it(make_spec) -> None:
    async with open_sandbox(make_spec(memory_mb=512)) as sb:
        got, err = await _hog(sb, AIO)
        # While the sandbox holds whatever it got, the host's own io_setup still works.
        libc = ctypes.CDLL(None, use_errno=True)
        ctx = ctypes.c_ulong(0)
        assert libc.syscall(206, 128, ctypes.byref(ctx)) == 0, os.strerror(ctypes.get_errno())
        assert libc.syscall(207, ctx) == 0  # io_destroy
        assert (got, err) == (0, errno.ENOSYS)  # because the sandbox got none


async def test_only_namespaced_socket_families(sb) -> None:
    script = """
import errno, socket
for family, kind in ((40, socket.SOCK_STREAM), (40, socket.SOCK_DGRAM), (38, socket.SOCK_SEQPACKET),
                     (31, socket.SOCK_STREAM), (15, socket.SOCK_RAW), (21, socket.SOCK_SEQPACKET),
                     (30, socket.SOCK_STREAM), (29, socket.SOCK_RAW), (44, socket.SOCK_RAW),
                     (16, socket.SOCK_RAW), (16, socket.SOCK_DGRAM)):
    try:
        socket.socket(family, kind).close()
        print(family, "created")
    except OSError as exc:
        print(family, errno.errorcode[exc.errno])
try:
    socket.socketpair(40, socket.SOCK_STREAM)
    print("pair created")
except OSError as exc:
    print("pair", errno.errorcode[exc.errno])
for family, protocol in ((socket.AF_INET, 1), (socket.AF_INET6, 58)):  # ping sockets
    try:
        socket.socket(family, socket.SOCK_DGRAM, protocol).close()
        print("ping created")
    except OSError as exc:
        print("ping", errno.errorcode[exc.errno])
for family in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6):
    socket.socket(family, socket.SOCK_STREAM).close()
a, b = socket.socketpair()
print("honest ok")
"""
    r = await sb.exec(["python3", "-c", script], timeout=20)
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "honest ok"
    for line in lines[:-1]:
        refusal = "EACCES" if line.startswith("ping") else "EAFNOSUPPORT"  # AF_VSOCK first
        assert line.split()[1] == refusal, r.stdout


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the probe uses x86_64 numbers")
async def test_memfd_secret_is_absent(sb) -> None:
    """Secret memory is taken out of the kernel's direct map page by page, splitting its huge
    pages for good: machine-wide damage no memory limit bounds. The call answers ENOSYS."""
    script = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              "print(libc.syscall(447, 0), ctypes.get_errno())\n")
    r = await sb.exec(["python3", "-c", script], timeout=20)
    assert r.exit_code == 0 and r.stdout.split() == ["-1", str(errno.ENOSYS)], r


BPF_PROGRAMS = r"""
import ctypes, errno, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
s = socket.socket()
code = (ctypes.c_ubyte * 8)(*struct.pack("HBBI", 6, 0, 0, 0xffff))  # ret 0xffff
program = struct.pack("HL", 1, ctypes.addressof(code))
for name, option in (("filter", 26), ("reuseport filter", 51)):
    try:
        s.setsockopt(socket.SOL_SOCKET, option, program)
        print(name, "attached")
    except OSError as exc:
        print(name, errno.errorcode[exc.errno])
print("prctl", libc.prctl(22, 2, ctypes.addressof(code), 0, 0), ctypes.get_errno())
print("seccomp", libc.syscall(317, 1, 0, ctypes.addressof(code)), ctypes.get_errno())
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
print("other options ok")
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the probe uses x86_64 numbers")
async def test_no_bpf_programs_of_the_sandboxs_own(sb) -> None:
    """Socket and seccomp filters are JIT-compiled into memory from one machine-wide budget
    (net.core.bpf_jit_limit) that no memory cgroup counts: one sandbox filled it, and no new
    sandbox could install its own seccomp filter. Both answer EPERM inside."""
    r = await sb.exec(["python3", "-c", BPF_PROGRAMS], timeout=20)
    assert r.exit_code == 0, r
    assert r.stdout.splitlines() == [
        "filter EPERM", "reuseport filter EPERM", f"prctl -1 {errno.EPERM}",
        f"seccomp -1 {errno.EPERM}", "other options ok"], r.stdout


async def test_open_files_are_bounded_by_memory_not_by_a_machine_wide_table(make_spec) -> None:
    """One sandbox filled the kernel's open-file table (a tenth of RAM at 1 KiB a file, while
    a file is charged a fifth of that to its memory cgroup): the table is made as large as
    systemd makes it, so each sandbox's files are bounded by its own memory."""
    async with open_sandbox(make_spec()) as sb:
        assert (await sb.exec("true")).exit_code == 0
    with open("/proc/sys/fs/file-max") as f:
        assert int(f.read()) >= 1 << 62


async def test_every_sandbox_runs_as_a_host_uid_of_its_own(make_spec) -> None:
    uids = uid_range()
    async with open_sandbox(make_spec()) as a, open_sandbox(make_spec()) as b:
        await a.write_file("kept.txt", "parent")
        await a.exec("chmod 600 kept.txt", timeout=10)
        child = await a.fork()
        try:
            seen = []
            for sb in (a, b, child):
                pid = sb._init_pid  # type: ignore[attr-defined]
                with open(f"/proc/{pid}/status") as f:
                    status = dict(line.split(":", 1) for line in f if ":" in line)
                ids = status["Uid"].split()
                assert ids == [ids[0]] * 4
                seen.append(int(ids[0]))
            assert len(set(seen)) == 3 and all(uids.first <= u <= uids.last for u in seen)
            # The fork owns its copy (even the parent's private file) and can change it.
            r = await child.exec("cat kept.txt && echo child >> kept.txt && touch new", timeout=10)
            assert r.exit_code == 0 and r.stdout == "parent", r
            assert (await a.read_file("kept.txt")) == b"parent"
        finally:
            await child.close()
    for uid in seen:  # each lease went with its sandbox
        assert not (home() / "uids" / str(uid)).exists()


# Three uids of their own (the spawner's and two sandbox uids), so that two processes must meet.
SMALL_RANGE = {"TEMPERING_SANDBOX_UID": str(0x7002_0000), "TEMPERING_SANDBOX_UID_COUNT": "3"}


def _python(script: str, **kw) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    env = {**os.environ, **SMALL_RANGE, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env=env, **kw)


def test_a_lease_is_unique_across_processes_and_freed_with_its_owner() -> None:
    # One process leases a uid, starts a process that runs as it, and will die holding it.
    owner = _python("import subprocess, sys\nfrom tempering.sandbox.uids import lease_uid\n"
                    "lease = lease_uid()\n"
                    "p = subprocess.Popen(['sleep', '300'], user=lease.uid, group=lease.gid, "
                    "extra_groups=[], start_new_session=True)\n"
                    "print(lease.uid, p.pid, flush=True)\nsys.stdin.read()\n",
                    stdin=subprocess.PIPE)
    assert owner.stdout is not None
    uid, sleeper = (int(x) for x in owner.stdout.readline().split())
    try:
        # Another process gets the other uid, and then none: the owner's is never given.
        other = _python("from tempering.errors import SandboxStartError\n"
                        "from tempering.sandbox.uids import lease_uid\n"
                        "first = lease_uid()\ntry:\n    lease_uid()\n    print(first.uid, 'more')\n"
                        "except SandboxStartError:\n    print(first.uid, 'full')\n"
                        "first.release()\n")
        got, rest = other.communicate(timeout=60)[0].split()
        assert int(got) != uid and rest == "full"
        owner.kill()
        owner.wait()
        assert _alive(sleeper)  # what ran as the uid outlived its owner
        reclaim = _python("from tempering.sandbox.uids import reclaim_uids\n"
                          "print(*reclaim_uids())\n")
        freed = reclaim.communicate(timeout=60)[0].split()
        assert freed == [str(uid)]  # a dead owner's lease, and only that one
        for _ in range(100):
            if not _alive(sleeper):
                break
            time.sleep(0.01)
        assert not _alive(sleeper)  # killed when its uid was freed
    finally:
        owner.kill()
        with contextlib.suppress(OSError):
            os.kill(sleeper, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
