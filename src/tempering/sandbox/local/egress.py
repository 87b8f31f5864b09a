"""The way out of a local sandbox with ``network=True``: a network namespace of its own, wired
to a user-mode TCP/IP stack, with everything near the host refused inside it.

Every local sandbox has its own network namespace (abstract unix sockets are per namespace, so
the host's are out of reach too); one without network keeps only ``lo``. One with network gets
``slirp4netns`` attached: a tap device inside, and outside a process of the sandbox uid in the
host's namespace that opens ordinary sockets for the sandbox's connections (NAT in user space:
no bridge, no firewall rule on the host). It runs with ``--disable-host-loopback`` (its gateway
address would otherwise be the host's 127.0.0.1), ``--enable-sandbox`` (a mount namespace
whose root is an empty tmpfs with /etc and /run read-only, for its resolvers; no capability
but binding low ports, and those only in the sandbox's user namespace, where it starts) and
``--enable-seccomp``; in the sandbox's cgroups, so its CPU and memory count against the
sandbox; and it exits when the sandbox closes or this process dies: its ``--exit-fd`` is the
read end of a pipe whose only write end this process holds.

What the sandbox must not reach is refused inside its namespace, before anything runs, by
routing policy rules that its PID 1 installs while it still holds CAP_NET_ADMIN (``init.c``):
the stack's own gateway and DNS addresses first, then link-local (the cloud metadata service),
private and shared ranges, multicast and reserved ranges, this host's addresses and the networks
it is attached to (its LAN), and all of IPv6 (the stack carries IPv4 only). Rules are looked up
before any route, so the link routes the stack adds cannot get around them, and no command can
remove them: commands hold no capability. A refused destination fails at once with
ENETUNREACH; nothing is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import logging
import os
import shutil
import signal
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tempering.errors import SandboxError, SandboxStartError, SandboxUnavailableError
from tempering.sandbox.forkserver import Spawner
from tempering.sandbox.native import home
from tempering.sandbox.nearby import REFUSED, host_networks

IPv4Network = ipaddress.IPv4Network
log = logging.getLogger(__name__)

# Networks the stack may use for its side of the tap; the first that overlaps none of the
# host's is taken, so a host on 10.0.2.0/24 does not lose its LAN to the sandbox's gateway.
_STACK_NETWORKS = ("10.0.2.0/24", "10.213.0.0/24", "172.31.213.0/24", "192.168.213.0/24")
_MTU = 65520
_STACK_START_S = 10.0
STACK_FILES = 1024
"""Descriptors of a sandbox's network stack: its flows, at most (each one host socket)."""
_TUN = "/dev/net/tun"
_NS_GET_USERNS = 0xB701  # _IO(0xb7, 0x1): the user namespace that owns a namespace


@dataclass(frozen=True)
class Egress:
    """How one sandbox with network is wired: the stack's network and what PID 1 refuses."""

    network: IPv4Network
    """The stack's side of the tap: its gateway is .2, its DNS .3, the sandbox .100."""
    refused: tuple[str, ...]
    """Every refused destination, this host's own networks included."""

    @property
    def gateway(self) -> str:
        return str(self.network[2])

    @property
    def dns(self) -> str:
        return str(self.network[3])

    @property
    def init_rules(self) -> str:
        """PID 1's argument: its rules in order, first match wins; ``+`` routes normally (the
        gateway, which the default route needs, and the DNS forwarder), ``-`` is refused."""
        allowed = [f"+{self.gateway}/32", f"+{self.dns}/32"]
        return ",".join(allowed + [f"-{net}" for net in self.refused])

    @property
    def resolv_conf(self) -> Path:
        """A resolv.conf naming the stack's DNS forwarder (it asks the host's resolvers)."""
        return _resolv_conf(self.dns)


def egress() -> Egress:
    """The wiring for a sandbox starting now (the host's networks are read afresh: an address
    added since the last start is refused too). Raises SandboxUnavailableError, before any
    start, on a host that cannot run the stack."""
    slirp4netns()
    own = host_networks()
    network = next((IPv4Network(n) for n in _STACK_NETWORKS
                    if not any(IPv4Network(n).overlaps(o) for o in own)), None)
    if network is None:
        raise SandboxStartError(f"every network the sandbox's stack could use "
                                f"({', '.join(_STACK_NETWORKS)}) overlaps one of this host's "
                                f"({', '.join(map(str, own))})")
    # Only what no other rule covers (a rule twice would be refused by the kernel).
    refused = [IPv4Network(r) for r in REFUSED if ":" not in r]
    extra = [str(n) for n in own if not any(n.subnet_of(c) for c in refused)
             and not any(n != c and n.subnet_of(c) for c in own)]
    return Egress(network, REFUSED + tuple(extra))


@cache
def _resolv_conf(dns: str) -> Path:
    path = home() / "etc" / f"resolv-{dns}.conf"
    text = f"nameserver {dns}\n"
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(text)
        tmp.chmod(0o644)
        os.replace(tmp, path)
    return path


@cache
def _bounded() -> list[str]:
    """util-linux's prlimit, setting the stack's descriptors (``STACK_FILES``) before it
    runs: the host cannot lower them later, once it is in the sandbox's user namespace."""
    path = shutil.which("prlimit")
    return [path, f"--nofile={STACK_FILES}:{STACK_FILES}", "--"] if path else []


def slirp4netns() -> str:
    """The stack's binary, once this host is checked able to run it as the sandbox uid."""
    path = shutil.which("slirp4netns")
    if path is None:
        raise SandboxUnavailableError(
            "a local sandbox with network=True needs slirp4netns (its user-mode network "
            "stack); install it with `apt-get install -y slirp4netns` (scripts/setup.sh does)")
    try:
        mode = os.stat(_TUN).st_mode
    except OSError as exc:
        raise SandboxUnavailableError(
            f"a local sandbox with network=True needs {_TUN} ({exc.strerror}); load the "
            "module with `modprobe tun`") from None
    if mode & 0o006 != 0o006:
        # udev makes it 0666 on standard systems (opening it grants nothing: making a device
        # takes CAP_NET_ADMIN in a network namespace); hosts without udev leave it 0600.
        log.warning("making %s 0666, as udev does, so the unprivileged sandbox uid's network "
                    "stack can open it", _TUN)
        os.chmod(_TUN, 0o666)
    return os.path.realpath(path)


@cache
def _nsenter() -> str:
    path = shutil.which("nsenter")
    if path is None:
        raise SandboxUnavailableError("a local sandbox with network=True needs nsenter; "
                                      "install it with `apt-get install -y util-linux`")
    return os.path.realpath(path)


class Stack:
    """One running slirp4netns, attached to one sandbox's network namespace."""

    def __init__(self, pid: int, exited: asyncio.Future[int], exit_w: int, log: int) -> None:
        self.pid = pid
        self._exited = exited
        self._exit_w = exit_w
        self._log = log

    def output(self) -> str:
        """What the stack wrote to its stderr (for a failure's message)."""
        with contextlib.suppress(OSError):
            return os.pread(self._log, 4096, 0).decode(errors="replace").strip()
        return ""

    async def close(self) -> None:
        """Stop the stack: it exits when its exit pipe closes; killed if it has not in 5 s."""
        if self._exit_w >= 0:
            os.close(self._exit_w)
            self._exit_w = -1
        for last_resort in (False, True):
            try:
                await asyncio.wait_for(asyncio.shield(self._exited), 5.0)
                break
            except TimeoutError:
                if not last_resort:
                    with contextlib.suppress(OSError):
                        os.kill(self.pid, signal.SIGKILL)
            except SandboxError:  # the spawner died; the closed pipe ends the stack anyway
                break
        if self._log >= 0:
            os.close(self._log)
            self._log = -1

    def kill_now(self) -> None:
        """Synchronous last resort (interpreter exit)."""
        if self._exit_w >= 0:
            os.close(self._exit_w)
            self._exit_w = -1
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)


async def start_stack(spawner: Spawner, init_pid: int, wiring: Egress, uid: int) -> Stack:
    """Start slirp4netns, as the sandbox's host ``uid``, on the network namespace of
    ``init_pid``; returns once the sandbox's interface, address and default route are up."""
    binary = slirp4netns()
    # Its fds: 0, 1 /dev/null, 2 a log, 3 the exit pipe, 4 the ready pipe, 5 the user namespace
    # that owns the network namespace (bubblewrap's: PID 1 moves to a nested one as it drops
    # its capabilities), 6 the network namespace. Namespaces go as fds: nothing is looked up
    # by a pid that could be another process's by then.
    theirs: list[int] = []  # closed here once the spawner has them
    ours: list[int] = []  # kept by the Stack
    try:
        netns = os.open(f"/proc/{init_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        theirs.append(netns)
        owner = fcntl.ioctl(netns, _NS_GET_USERNS)  # the kernel opens it close-on-exec
        theirs.append(owner)
        exit_r, exit_w = os.pipe()
        ready_r, ready_w = os.pipe()
        log = os.memfd_create("slirp4netns-stderr", os.MFD_CLOEXEC)
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        theirs += [exit_r, ready_w, devnull]
        ours += [exit_w, ready_r, log]
        # It starts in that user namespace (still in the host's network namespace), where the
        # sandbox uid is root, so its --enable-sandbox can make its mount namespace and drop
        # its capabilities (unprivileged, it would look that namespace up by pid).
        # Each flow the sandbox opens is a host socket of the stack's, and a UDP flow to the
        # resolver binds a port of the host's ephemeral range: bounded per sandbox (red
        # team, round thirty-two: 20,000 descriptors a sandbox, four held 94% of the range).
        argv = [*_bounded(), _nsenter(), "--user=/proc/self/fd/5", "--preserve-credentials",
                binary,
                "--configure", f"--mtu={_MTU}", "--disable-host-loopback",
                "--enable-sandbox", "--enable-seccomp", f"--cidr={wiring.network}",
                "--exit-fd=3", "--ready-fd=4", "--netns-type=path", "/proc/self/fd/6", "tap0"]
        started, exited = spawner.request(argv, [devnull, devnull, log, exit_r, ready_w, owner,
                                                 netns], uid, uid)
        for fd in theirs:
            os.close(fd)
        theirs = []
        pid = await started
    except BaseException:
        for fd in theirs + ours:
            os.close(fd)
        raise
    stack = Stack(pid, exited, exit_w, log)
    try:
        async with asyncio.timeout(_STACK_START_S):
            ready = await _read_ready(ready_r)
        if not ready:
            raise SandboxStartError("the network stack (slirp4netns) exited before the "
                                    f"sandbox's network was up: {stack.output() or '?'}")
    except TimeoutError:
        await stack.close()
        raise SandboxStartError(f"the network stack (slirp4netns) did not bring the sandbox's "
                                f"network up in {_STACK_START_S:g} s: {stack.output()}") from None
    except BaseException:
        await stack.close()
        raise
    finally:
        os.close(ready_r)
    return stack


async def _read_ready(fd: int) -> bool:
    """True once slirp4netns writes to its ready pipe, False at EOF: it exited first (it holds
    the only write end)."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    while True:
        readable: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _settle, readable)
        try:
            await readable
        finally:
            loop.remove_reader(fd)
        try:
            return bool(os.read(fd, 64))
        except BlockingIOError:
            continue


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
