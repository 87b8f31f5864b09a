"""The read-only system a local sandbox sees, as bubblewrap arguments.

By default that system is this host's, reduced to what programs need: ``/usr`` (without
``/usr/local``, where site-specific tools and secrets tend to live) and the usual links into it,
and a curated ``/etc`` (no shadow, no ssh, no machine secrets) with synthetic ``passwd``,
``group``, ``hostname`` and ``hosts``. Nothing of ``/home``, ``/root``, ``/run``, ``/var`` or the
host's ``/tmp`` is there, and no engine socket. A spec may instead name another root filesystem
(a directory), whose top-level directories are mounted read-only in the same way.
"""

from __future__ import annotations

import os
from functools import cache

from tempering.sandbox.native import empty_dir, etc_files, etc_view
from tempering.sandbox.spec import SandboxSpec

# /etc entries that programs read and that hold nothing private.
_ETC = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone",
        "mime.types", "nsswitch.conf", "protocols", "services", "ssl", "ca-certificates",
        "ca-certificates.conf", "python3", "python3.11", "python3.12", "python3.13",
        "debian_version", "os-release", "lsb-release", "bash.bashrc", "inputrc", "magic",
        "gai.conf", "host.conf", "login.defs", "shells", "environment", "papersize", "ucf.conf",
        "gitconfig", "vim", "perl", "xdg")
# Top-level entries of a root filesystem of the user's own that are never mounted from it.
_SKIP_TOP = {"proc", "dev", "sys", "tmp", "run", "home", "root", "boot", "lost+found", "media",
             "mnt", "srv", "var", ".tempering", "workspace"}


def system_args(spec: SandboxSpec, uid: int, gid: int, resolv_conf: str | None = None
                ) -> list[str]:
    """bubblewrap arguments that build the sandbox's read-only system; ``resolv_conf`` (a host
    file) becomes its /etc/resolv.conf, for a sandbox with network."""
    return list(_system_args(spec.rootfs, resolv_conf, uid, gid))


@cache  # a root filesystem's layout does not change while sandboxes use it
def _system_args(rootfs: str | None, resolv_conf: str | None, uid: int, gid: int
                 ) -> tuple[str, ...]:
    if rootfs is None:
        root, tops = "/", ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"]
    else:
        root = rootfs
        tops = sorted(e for e in os.listdir(root) if e not in _SKIP_TOP and e != "etc")
    args: list[str] = []
    for top in tops:
        host = os.path.join(root, top)
        if os.path.islink(host):
            args += ["--symlink", os.readlink(host), f"/{top}"]
        elif os.path.isdir(host):
            args += ["--ro-bind", host, f"/{top}"]
    if rootfs is None:
        args += ["--ro-bind", str(etc_view(_ETC, uid, gid)), "/etc"]
        if os.path.isdir("/usr/local"):
            args += ["--ro-bind", str(empty_dir()), "/usr/local"]
    else:
        args += _own_etc_args(root, uid, gid)
    # A root filesystem of the user's own keeps a resolv.conf that is a link (to its own
    # resolver's file, say): bubblewrap cannot bind over a link that leads nowhere here.
    own = os.path.join(root, "etc", "resolv.conf")
    if resolv_conf is not None and (rootfs is None or (os.path.isfile(own)
                                                       and not os.path.islink(own))):
        args += ["--ro-bind", resolv_conf, "/etc/resolv.conf"]
    args += ["--dir", "/var", "--symlink", "../tmp", "/var/tmp", "--dir", "/run"]
    return tuple(args)


def _own_etc_args(root: str, uid: int, gid: int) -> list[str]:
    """A root filesystem of the user's own keeps its /etc, with our users and host names on
    top of the files it has."""
    etc = os.path.join(root, "etc")
    if not os.path.isdir(etc):
        return []
    args = ["--ro-bind", etc, "/etc"]
    for name, path in etc_files(uid, gid).items():
        if name != "resolv.conf" and os.path.isfile(os.path.join(etc, name)):
            args += ["--ro-bind", str(path), f"/etc/{name}"]
    return args
