"""A sandbox with ``network=True`` gets egress, and nothing of this host: attacks from inside
real sandboxes against real listeners the test opens on this machine.

No test sends a packet off this machine. Destinations that are not this machine's own are only
ever probed after ``ip route get`` has shown them refused inside the sandbox, so the probe
cannot leave it: if the route were there, the test fails before it connects. A sandbox cannot
open netlink sockets, so ``ip`` runs from this host in the sandbox's network namespace
(``ip_in``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backends import unavailable
from tempering.sandbox import Sandbox, SandboxSpec, open_sandbox

# connect() to each (family, address, port) argument; prints one JSON line per attempt with
# the errno it failed with (0: connected) and how long it took.
PROBE = textwrap.dedent("""
    import errno, json, socket, sys, time
    for target in sys.argv[1:]:
        family, address, port = target.rsplit(",", 2)
        kind = socket.AF_UNIX if family == "unix" else (
            socket.AF_INET6 if family == "6" else socket.AF_INET)
        s = socket.socket(kind, socket.SOCK_STREAM)
        s.settimeout(3)
        start = time.monotonic()
        try:
            s.connect(("\\0" + address) if kind == socket.AF_UNIX else
                      socket.getaddrinfo(address, int(port), kind)[0][4])  # keeps %scope
            code = 0
        except OSError as exc:
            code = exc.errno or -1
        print(json.dumps({"target": target, "errno": code, "errname": errno.errorcode.get(code),
                          "s": round(time.monotonic() - start, 3)}))
""")
ROUTE_ERRORS = {"ENETUNREACH", "EHOSTUNREACH"}


@pytest.fixture
def local_ready() -> None:
    why = unavailable("local")
    if why:
        pytest.skip(f"local backend unavailable: {why}")


@pytest.fixture
async def net_sb(local_ready: None) -> AsyncIterator[Sandbox]:
    async with open_sandbox(SandboxSpec(backend="local", network=True, memory_mb=256,
                                        pids=64, timeout_s=30)) as sb:
        yield sb


async def probe(sb: Sandbox, *targets: str) -> dict[str, dict[str, object]]:
    r = await sb.exec(["python3", "-c", PROBE, *targets], timeout=30)
    assert r.exit_code == 0, r
    return {line["target"]: line for line in map(json.loads, r.stdout.splitlines())}


class Ran:
    def __init__(self, code: int, stdout: bytes, stderr: bytes) -> None:
        self.exit_code, self.stdout, self.stderr = code, stdout.decode(), stderr.decode()


async def ip_in(sb: Sandbox, *args: str) -> Ran:
    """This host's ``ip`` in ``sb``'s network namespace (what the sandbox's routes and rules
    say, read without a netlink socket inside it)."""
    pid = sb._init_pid  # type: ignore[attr-defined]
    proc = await asyncio.create_subprocess_exec(
        "nsenter", f"--net=/proc/{pid}/ns/net", "ip", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    return Ran(proc.returncode or 0, out, err)


async def links(sb: Sandbox) -> list[str]:
    r = await sb.exec("tail -n +3 /proc/net/dev | cut -d: -f1")
    return r.stdout.split()


def listener(address: str = "127.0.0.1", family: int = socket.AF_INET) -> socket.socket:
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind((address, 0))
    server.listen(8)
    server.setblocking(False)
    return server


def accepted(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
        return True
    except BlockingIOError:
        return False


def own_addresses() -> list[str]:
    """This machine's IPv4 addresses beyond loopback (iproute2, independent of the code under
    test)."""
    out = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True,
                         check=True).stdout
    return [a["local"] for link in json.loads(out) for a in link.get("addr_info", [])
            if not a["local"].startswith("127.")]


# ---- this host's services ----


async def test_host_loopback_service_unreachable(net_sb: Sandbox) -> None:
    server = listener()
    port = server.getsockname()[1]
    try:
        route = (await ip_in(net_sb, "-4", "route", "show", "default")).stdout.split()
        # Only the stack's gateway is probed, never a real one (this machine's LAN's).
        assert route[3:5] == ["dev", "tap0"], route
        gateway = route[2]
        # 127.0.0.1 is the sandbox's own loopback; the stack's gateway would be the host's.
        seen = await probe(net_sb, f"4,127.0.0.1,{port}", f"4,{gateway},{port}")
        assert all(p["errno"] != 0 for p in seen.values()), seen
        assert not accepted(server)
    finally:
        server.close()


async def test_host_abstract_unix_socket_unreachable(net_sb: Sandbox) -> None:
    name = f"tempering-test-{secrets.token_hex(6)}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + name)
    server.listen(8)
    server.setblocking(False)
    try:
        seen = await probe(net_sb, f"unix,{name},0")
        assert seen[f"unix,{name},0"]["errname"] == "ECONNREFUSED", seen
        assert not accepted(server)
    finally:
        server.close()


async def test_host_own_addresses_refused_at_once(net_sb: Sandbox) -> None:
    addresses = own_addresses()
    if not addresses:
        pytest.skip("this machine has no IPv4 address beyond loopback")
    servers = [listener(a) for a in addresses]
    try:
        targets = [f"4,{a},{s.getsockname()[1]}" for a, s in zip(addresses, servers, strict=True)]
        seen = await probe(net_sb, *targets)
        for target in targets:
            assert seen[target]["errname"] in ROUTE_ERRORS, seen[target]
            assert float(seen[target]["s"]) < 0.5, seen[target]  # refused, not timed out
        assert not any(accepted(s) for s in servers)
    finally:
        for s in servers:
            s.close()


async def test_private_metadata_and_ipv6_refused_without_a_packet(net_sb: Sandbox) -> None:
    targets = ["10.0.0.1", "169.254.169.254", "172.17.0.1", "192.168.1.1", "100.64.0.1",
               "fe80::1", "fd00::1", "2001:db8::1"]
    for address in targets:
        # The route must be refused before anything is probed (see the module docstring).
        r = await ip_in(net_sb, "route", "get", address)
        assert r.exit_code != 0 and "unreachable" in r.stderr, (address, r)
    # Link-local needs its interface named; IPv4-mapped IPv6 follows IPv4's rules.
    probes = [f"6,{a}%tap0,80" if a.startswith("fe80") else f"{'6' if ':' in a else '4'},{a},80"
              for a in targets]
    seen = await probe(net_sb, *probes, "6,::ffff:10.0.0.1,80")
    for result in seen.values():
        assert result["errname"] in ROUTE_ERRORS, result
        assert float(str(result["s"])) < 0.5, result


async def test_rules_cannot_be_removed_from_inside(net_sb: Sandbox) -> None:
    r = await net_sb.exec("ip rule del pref 103; ip rule flush; ip route add 10.0.0.0/8 dev tap0")
    assert "Cannot open netlink socket" in r.stderr, r  # no netlink at all, let alone rules
    assert (await ip_in(net_sb, "route", "get", "10.0.0.1")).exit_code != 0


async def test_tempering_serve_on_loopback_is_out_of_reach(net_sb: Sandbox) -> None:
    # The attack of issue 14: a sandbox with network ended its episode with reward 1 and
    # published weights through the server on the host's loopback.
    from tempering.policy.scripted import ScriptedPolicy
    from tempering.serve.server import PolicyServer

    ended: list[object] = []
    async with PolicyServer(ScriptedPolicy(["ok"]), on_trajectory=ended.append) as server:
        route = (await ip_in(net_sb, "-4", "route", "show", "default")).stdout.split()
        # The host's loopback by its name, and by the stack's gateway (never a real one).
        hosts = ["127.0.0.1"] + ([route[2]] if route[3:5] == ["dev", "tap0"] else [])
        attack = textwrap.dedent(f"""
            import urllib.request
            for host in {hosts!r}:
                for path in ("/v1/episodes/ep/end", "/v1/weights"):
                    request = urllib.request.Request(
                        f"http://{{host}}:{server.port}{{path}}", method="POST",
                        data=b'{{"reward": 1.0, "path": "/tmp/zeros", "version": 1000000000}}')
                    try:
                        urllib.request.urlopen(request, timeout=3)
                        print("reached", host, path)
                    except OSError as exc:
                        print("failed", host, path, exc)
        """)
        r = await net_sb.exec(["python3", "-c", attack], timeout=30)
        assert r.exit_code == 0 and "reached" not in r.stdout and "HTTP Error" not in r.stdout, r
        assert len(hosts) == 2, route
        assert ended == [] and server.policy.weights_version == 0


# ---- what egress there is ----


async def test_egress_is_wired_through_the_stack(net_sb: Sandbox) -> None:
    assert sorted(await links(net_sb)) == ["lo", "tap0"]
    route = (await ip_in(net_sb, "-4", "route", "show", "default")).stdout.split()
    assert route[:2] == ["default", "via"] and route[3:5] == ["dev", "tap0"], route
    nameservers = [line.split()[1] for line in
                   (await net_sb.exec("cat /etc/resolv.conf")).stdout.splitlines()
                   if line.startswith("nameserver")]
    gateway = route[2]
    assert nameservers == [gateway.rsplit(".", 1)[0] + ".3"]
    # A public destination is routed (inspected only, never sent to).
    r = await ip_in(net_sb, "route", "get", "192.0.43.10")
    assert r.exit_code == 0 and "dev tap0" in r.stdout, r


async def test_without_network_only_loopback(local_ready: None) -> None:
    async with open_sandbox(SandboxSpec(backend="local")) as sb:
        assert await links(sb) == ["lo"]
        assert (await ip_in(sb, "route", "get", "192.0.43.10")).exit_code != 0


def test_host_networks_are_its_addresses_and_attached_networks(tmp_path: Path) -> None:
    from tempering.sandbox.local.egress import egress
    from tempering.sandbox.nearby import host_networks

    trie = tmp_path / "fib_trie"  # the kernel's format, as /proc/net/fib_trie shows it
    trie.write_text(textwrap.dedent("""\
        Main:
          +-- 0.0.0.0/0 3 0 5
             |-- 0.0.0.0
                /0 universe UNICAST
             +-- 127.0.0.0/8 2 0 2
                |-- 127.0.0.1
                   /32 host LOCAL
             +-- 198.51.100.0/24 2 0 2
                |-- 198.51.100.0
                   /24 link UNICAST
                |-- 198.51.100.7
                   /32 host LOCAL
                |-- 198.51.100.255
                   /32 link BROADCAST
             |-- 203.0.113.9
                /32 host LOCAL
    """))
    assert [str(n) for n in host_networks(str(trie))] == [
        "198.51.100.0/24", "198.51.100.7/32", "203.0.113.9/32"]
    # This host's own, whatever they are, are refused too (each once).
    rules = egress().init_rules.split(",")
    assert len(rules) == len(set(rules))
    for address in own_addresses():
        assert any(r.startswith("-") and ":" not in r and ipaddress.ip_address(address) in
                   ipaddress.ip_network(r[1:]) for r in rules), address


# ---- the stack's lifetime ----


def _stacks() -> set[int]:
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "slirp4netns":
                found.add(int(pid))
        except OSError:
            pass
    return found


def _mounts() -> set[str]:
    """This mount namespace's mount points, but Docker's (other suites' containers come and
    go meanwhile)."""
    points = (line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())
    return {p for p in points if "docker" not in p}


def _fds(prefix: str) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(prefix):
            found.append(target)
    return found


async def test_stack_is_confined_and_dies_with_the_sandbox(local_ready: None) -> None:
    async with open_sandbox(SandboxSpec(backend="local", network=True)):
        pass  # what the first sandbox of a process sets up (the spawner) stays
    pipes_before = _fds("pipe:")
    mounts_before = _mounts()
    before = _stacks()
    async with open_sandbox(SandboxSpec(backend="local", network=True)) as sb:
        (stack,) = _stacks() - before
        status = dict(line.split(":", 1) for line in
                      Path(f"/proc/{stack}/status").read_text().splitlines())
        assert status["Uid"].split()[0] != "0"  # the sandbox uid, never root
        assert int(status["CapEff"], 16) & ~(1 << 10) == 0  # at most CAP_NET_BIND_SERVICE
        assert status["Seccomp"].strip() == "2"
        assert os.readlink(f"/proc/{stack}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        assert os.readlink(f"/proc/{stack}/ns/net") == os.readlink("/proc/self/ns/net")
        cgroup = Path(f"/proc/{stack}/cgroup").read_text()
        assert sb.id in cgroup  # its CPU and memory count against the sandbox
        # ... its memory with the commands', whose traffic makes it (round thirty-two)
        assert f"{sb.id}/commands" in cgroup
        limits = Path(f"/proc/{stack}/limits").read_text()
        assert any(line.startswith("Max open files") and line.split()[3] == "1024"
                   for line in limits.splitlines()), limits
    deadline = time.monotonic() + 5
    while stack in _stacks() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stack not in _stacks()
    # Its pipes, its log and the namespaces it was handed are closed here (other threads of
    # the harness may hold pipes for a moment: the count is awaited).
    assert not _fds("net:[") and not _fds("user:[") and not _fds("/memfd:slirp4netns")
    deadline = time.monotonic() + 2
    while len(_fds("pipe:")) > len(pipes_before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_fds("pipe:")) <= len(pipes_before)
    assert _mounts() == mounts_before


FLOWS = """import socket, time
for i in range(4000):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"x", ("10.0.2.3", 9999))
    s.close()
    if i % 200 == 0:
        time.sleep(0.01)
"""


async def test_flows_are_bounded_and_charged_to_the_commands(net_sb: Sandbox) -> None:
    """Each UDP flow is a host socket of the stack's: a flood held 20,000 of them a sandbox,
    their memory in the init's reserve, past it (red team, round thirty-two). The stack has
    1,024 descriptors, and its memory is the commands'."""
    stack = net_sb._stack.pid  # type: ignore[attr-defined]
    r = await net_sb.exec(["python3", "-c", FLOWS], timeout=60)
    assert r.exit_code == 0, r.stderr
    assert len(os.listdir(f"/proc/{stack}/fd")) <= 1024
    cgroup = net_sb._cgroup  # type: ignore[attr-defined]
    usage = "memory.usage_in_bytes" if cgroup.hierarchy.version == 1 else "memory.current"
    outside = (int((cgroup.memory / usage).read_text())
               - int((cgroup.commands / usage).read_text()))
    assert outside < 16 << 20, outside
    assert (await net_sb.exec("echo alive")).stdout == "alive\n"


async def test_a_fork_gets_a_stack_and_rules_of_its_own(net_sb: Sandbox) -> None:
    before = _stacks()
    child = await net_sb.fork()
    try:
        assert len(_stacks() - before) == 1
        assert sorted(await links(child)) == ["lo", "tap0"]
        assert (await ip_in(child, "route", "get", "169.254.169.254")).exit_code != 0
        assert (await ip_in(child, "route", "get", "192.0.43.10")).exit_code == 0
    finally:
        await child.close()
    assert (await ip_in(net_sb, "route", "get", "192.0.43.10")).exit_code == 0


def test_stack_dies_with_the_harness(local_ready: None, tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import asyncio, sys
        from tempering.sandbox import SandboxSpec, open_sandbox
        async def main():
            async with open_sandbox(SandboxSpec(backend="local", network=True)) as sb:
                print("up", flush=True)
                await asyncio.sleep(60)
        asyncio.run(main())
    """)
    before = _stacks()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        stacks = _stacks() - before
        assert len(stacks) == 1
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    deadline = time.monotonic() + 10
    while stacks & _stacks() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not stacks & _stacks()


# ---- the docker backend: a bridge fenced by this host's firewall ----

# The host answers each SYN with ICMP host-prohibited (EHOSTUNREACH, never a timeout); the
# kernel rate-limits those answers, so one of several in a row may come with the SYN's retry.
DOCKER_REJECT_S = 2.5

GATEWAY = textwrap.dedent("""
    import socket, struct
    for line in open("/proc/net/route").readlines()[1:]:
        fields = line.split()
        if fields[1] == "00000000":
            gateway = socket.inet_ntoa(struct.pack("<I", int(fields[2], 16)))
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((gateway, 9))  # UDP: picks the source address, sends nothing
    print(gateway, s.getsockname()[0])
""")


@pytest.fixture
async def docker_net(docker_ready: None) -> AsyncIterator[Sandbox]:
    async with open_sandbox(SandboxSpec(backend="docker", network=True, memory_mb=256,
                                        pids=64, timeout_s=30)) as sb:
        yield sb


async def addresses_of(sb: Sandbox) -> tuple[str, str]:
    """(its gateway, its own address)."""
    r = await sb.exec(["python3", "-c", GATEWAY])
    gateway, own = r.stdout.split()
    return gateway, own


def iptables_rules(chain: str) -> str:
    return subprocess.run(["iptables", "-S", chain], capture_output=True, text=True).stdout


def interface_of(address: str) -> str:
    out = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True,
                         check=True).stdout
    return next((link["ifname"] for link in json.loads(out)
                 for a in link.get("addr_info", []) if a["local"] == address), "")


async def test_docker_host_and_its_services_unreachable(docker_net: Sandbox) -> None:
    gateway, _ = await addresses_of(docker_net)
    name = f"tempering-test-{secrets.token_hex(6)}"
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind("\0" + name)
    abstract.listen(8)
    abstract.setblocking(False)
    loop = listener()
    hosts = [listener(a) for a in {*own_addresses(), gateway}]  # this machine's, all of them
    try:
        port = loop.getsockname()[1]
        targets = [f"4,{s.getsockname()[0]},{s.getsockname()[1]}" for s in hosts]
        seen = await probe(docker_net, f"4,127.0.0.1,{port}", f"4,{gateway},{port}",
                           f"unix,{name},0", *targets)
        assert all(p["errno"] != 0 for p in seen.values()), seen
        for target in targets:  # rejected by the host's firewall, not timed out
            assert seen[target]["errname"] in ROUTE_ERRORS, seen[target]
            assert float(str(seen[target]["s"])) < DOCKER_REJECT_S, seen[target]
        assert not any(accepted(s) for s in [abstract, loop, *hosts])
    finally:
        for s in [abstract, loop, *hosts]:
            s.close()


async def test_docker_private_ranges_and_metadata_rejected_on_this_host(
        docker_net: Sandbox) -> None:
    gateway, _ = await addresses_of(docker_net)
    # Probed only once this host is seen to reject them (see the module docstring).
    assert interface_of(gateway) == "tmp-egress0"
    chain = iptables_rules("TEMPERING-EGRESS")
    for net in ("10.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16"):
        assert f"-d {net} -j REJECT" in chain, chain
    jumps = iptables_rules("DOCKER-USER")
    assert "-i tmp-egress0 -j TEMPERING-EGRESS" in jumps.split("-A DOCKER-USER -j RETURN")[0]
    seen = await probe(docker_net, "4,10.0.0.1,80", "4,169.254.169.254,80", "4,192.168.1.1,80")
    for result in seen.values():
        assert result["errname"] in ROUTE_ERRORS, result
        assert float(str(result["s"])) < DOCKER_REJECT_S, result


async def test_docker_sandboxes_cannot_reach_each_other(docker_ready: None) -> None:
    spec = SandboxSpec(backend="docker", network=True, timeout_s=30)
    serve = ("import socket, time\ns = socket.socket()\ns.bind(('0.0.0.0', 8765))\n"
             "s.listen()\nwhile True: s.accept()[0].close()")
    async with open_sandbox(spec) as a, open_sandbox(spec) as b:
        _, a_address = await addresses_of(a)
        server = await a.start(["python3", "-c", serve])
        try:
            for _ in range(50):  # until it listens: A itself reaches it
                if (await probe(a, "4,127.0.0.1,8765"))["4,127.0.0.1,8765"]["errno"] == 0:
                    break
            else:
                pytest.fail("the listener in sandbox A never came up")
            seen = await probe(b, f"4,{a_address},8765")
            assert seen[f"4,{a_address},8765"]["errno"] != 0, seen
        finally:
            await server.kill()
