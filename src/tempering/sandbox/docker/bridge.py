"""The docker backend's network for ``network=True``: a bridge of its own, with this host and
everything near it refused by the host's firewall.

Docker's default bridge keeps a container off the host's loopback (``route_localnet`` is off),
but lets it reach the host itself (the bridge's gateway address and every other address of the
host, whatever listens on 0.0.0.0), the other containers of the bridge, the host's LAN, private
ranges and the cloud metadata service (through the host's NAT). Containers with network join
``tempering-egress`` instead, a bridge named ``tmp-egress0`` without inter-container traffic
(``enable_icc=false``), and two iptables rules keyed on that interface, installed once per
process (idempotent; they touch nothing else):

- ``INPUT -i tmp-egress0 -j REJECT``: nothing from the bridge reaches the host itself. Docker's
  DNS for the containers answers inside each container's namespace, so names still resolve.
- ``DOCKER-USER -i tmp-egress0 -j TEMPERING-EGRESS``: forwarded traffic to the ranges the local
  backend refuses (``nearby.REFUSED``) and to the host's own networks is rejected before
  Docker's own rules, at once (ICMP host-prohibited: EHOSTUNREACH, nothing leaves).

The firewall is this machine's, so this needs root here and an engine on this machine (its unix
socket): anything else is ``SandboxUnavailableError``, not a container with open network.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess

from tempering.errors import SandboxUnavailableError
from tempering.sandbox.docker.api import DockerAPI, DockerAPIError
from tempering.sandbox.nearby import REFUSED, host_networks

__all__ = ["BRIDGE", "CHAIN", "NETWORK", "egress_network"]

NETWORK, BRIDGE, CHAIN = "tempering-egress", "tmp-egress0", "TEMPERING-EGRESS"
_REJECT = ["-j", "REJECT", "--reject-with", "icmp-host-prohibited"]
_ready: dict[str, asyncio.Lock] = {}
_done: set[str] = set()


async def egress_network(engine: DockerAPI) -> str:
    """The network a container with network joins, made and fenced on first use."""
    if engine.path in _done:
        return NETWORK
    async with _ready.setdefault(engine.path, asyncio.Lock()):
        if engine.path not in _done:
            await _ensure_network(engine)
            await asyncio.to_thread(install_rules)
            _done.add(engine.path)
    return NETWORK


async def _ensure_network(engine: DockerAPI) -> None:
    try:
        await engine.request("GET", f"/networks/{NETWORK}", what=f"inspecting {NETWORK}")
        return
    except DockerAPIError as exc:
        if exc.status != 404:
            raise
    try:
        await engine.request("POST", "/networks/create", what=f"creating network {NETWORK}",
                             body={"Name": NETWORK, "Driver": "bridge", "CheckDuplicate": True,
                                   "Labels": {"tempering.network": "egress"},
                                   "Options": {"com.docker.network.bridge.name": BRIDGE,
                                               "com.docker.network.bridge.enable_icc": "false"}})
    except DockerAPIError as exc:
        if exc.status != 409:  # another process made it meanwhile
            raise


def install_rules() -> None:
    """(Re)write the refusing chain and make sure both jumps are in place."""
    iptables = shutil.which("iptables")
    if iptables is None or os.geteuid() != 0:
        raise SandboxUnavailableError(
            "a docker sandbox with network=True needs this machine's firewall to fence its "
            f"bridge: run as root with iptables installed (`apt-get install -y iptables`); "
            f"{'iptables is missing' if iptables is None else 'not root'}")
    refused = [n for n in REFUSED if ":" not in n] + [str(n) for n in host_networks()]
    table = ["*filter", f":{CHAIN} - [0:0]"]  # declared again: flushed, then refilled
    table += [" ".join(["-A", CHAIN, "-d", net, *_REJECT]) for net in refused]
    _run([iptables + "-restore", "--noflush"], "\n".join([*table, "COMMIT", ""]))
    for chain, rule in (("DOCKER-USER", ["-i", BRIDGE, "-j", CHAIN]),
                        ("INPUT", ["-i", BRIDGE, *_REJECT])):
        if subprocess.run([iptables, "-C", chain, *rule], capture_output=True).returncode:
            _run([iptables, "-I", chain, "1", *rule])


def _run(argv: list[str], stdin: str | None = None) -> None:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True)
    if done.returncode != 0:
        raise SandboxUnavailableError(
            f"fencing the docker sandboxes' bridge failed: `{' '.join(argv)}`: "
            f"{done.stderr.strip()} (the DOCKER-USER chain exists once dockerd runs with its "
            "iptables integration, the default)")
