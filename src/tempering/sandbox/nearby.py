"""What a sandbox with network never reaches: this host and everything near it.

Both backends refuse the same destinations to a sandbox with ``network=True`` (the local one by
routing rules its PID 1 installs, ``local/egress.py``; the docker one by the host's firewall on
a bridge of its own, ``docker/bridge.py``): private, shared, link-local (cloud metadata),
multicast and reserved ranges, all of IPv6, and this host's own addresses and networks, read
from the kernel's routing tables when a sandbox starts.
"""

from __future__ import annotations

import ipaddress

IPv4Network = ipaddress.IPv4Network

REFUSED: tuple[str, ...] = (
    "0.0.0.0/8",        # "this network"
    "10.0.0.0/8",       # private
    "100.64.0.0/10",    # shared address space (carrier-grade NAT)
    "127.0.0.0/8",      # loopback: the sandbox's own is answered before any rule
    "169.254.0.0/16",   # link-local: cloud metadata services (169.254.169.254)
    "172.16.0.0/12",    # private (Docker's bridges)
    "192.0.0.0/24",     # IETF protocol assignments
    "192.168.0.0/16",   # private
    "198.18.0.0/15",    # benchmarking
    "224.0.0.0/4",      # multicast
    "240.0.0.0/4",      # reserved, broadcast
    "::/0",             # all of IPv6 (fe80::/10, fc00::/7 ...): the stack carries IPv4 only
)
"""Destinations a sandbox with network never reaches (besides this host's own networks)."""


def host_networks(fib_trie: str = "/proc/net/fib_trie") -> list[IPv4Network]:
    """This host's IPv4 addresses (as /32) and the networks it is attached to, from the
    kernel's routing tables (``/proc/net/fib_trie``: a leaf address, then ``/LEN scope TYPE``
    lines: ``host LOCAL`` for an address of this host, ``link UNICAST`` for a network on a
    link). Loopback is left out: the sandbox's own answers first."""
    found: set[IPv4Network] = set()
    with open(fib_trie) as f:
        leaf = None
        for line in f:
            words = line.replace("|--", " ").split()
            if len(words) == 1 and words[0].count(".") == 3:
                leaf = words[0]
            elif leaf and len(words) == 3 and words[0].startswith("/"):
                if (words[1], words[2]) in (("host", "LOCAL"), ("link", "UNICAST")):
                    length = 32 if words[2] == "LOCAL" else int(words[0][1:])
                    net = IPv4Network(f"{leaf}/{length}", strict=False)
                    if not net.is_loopback:
                        found.add(net)
    return sorted(found)
