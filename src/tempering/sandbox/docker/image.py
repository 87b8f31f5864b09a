"""The docker backend's default image, built from this host's own packages: no registry.

No image can be pulled on these machines (nor on many users' clusters), so ``tempering image
build`` makes one from what is installed here: the dependency closure of a few Debian packages
(Python 3 with pytest, a shell and the usual tools), read from dpkg's database, each package's
files copied as they are on disk (links kept as links), plus a synthetic ``/etc`` (an
unprivileged ``user``, uid 1000) and empty ``/workspace`` and ``/tmp``. The tar is streamed to
the engine's image import; nothing touches the network.

The tag is a digest of the packages and versions and of everything synthetic, so building is
cached (the same host gives the same tag, and an existing tag is not rebuilt) and repeatable.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import stat
import subprocess
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tempering.errors import SandboxUnavailableError
from tempering.sandbox.cgroup import owner_tag
from tempering.sandbox.docker.api import DockerAPI

REPOSITORY = "tempering/python"
BUILDER = "2"  # bump when the layout below changes: it is part of the tag
PACKAGES = ("python3", "python3-pytest", "tzdata", "bash", "dash", "coreutils", "grep", "sed",
            "mawk", "findutils", "diffutils", "procps", "tar", "gzip", "util-linux")
SKIP = ("/usr/share/doc/", "/usr/share/man/", "/usr/share/info/", "/usr/share/locale/",
        "/usr/share/lintian/", "/usr/local/", "/home", "/root", "/boot", "/srv", "/media",
        "/mnt", "/opt")
USER_UID = 1000
SYNTHETIC = {
    "etc/passwd": f"root:x:0:0:root:/root:/bin/sh\nuser:x:{USER_UID}:{USER_UID}:sandbox user:"
                  "/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "etc/group": f"root:x:0:\nuser:x:{USER_UID}:\nnogroup:x:65534:\n",
    "etc/hostname": "sandbox\n",
    "etc/hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    "etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
}
# (path, mode, owner uid) of the empty directories every sandbox needs
DIRECTORIES = (("tmp", 0o1777, 0), ("workspace", 0o755, USER_UID), ("proc", 0o555, 0),
               ("dev", 0o755, 0), ("sys", 0o555, 0), ("run", 0o755, 0), ("var", 0o755, 0),
               (".tempering", 0o755, 0))


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    arch: str


def installed() -> dict[str, tuple[Package, list[list[str]], list[str]]]:
    """Every installed package: itself, its dependencies (alternatives grouped), what it
    provides; read from dpkg in one call."""
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${Architecture}\t${Status}\t"
             "${Pre-Depends}\t${Depends}\t${Provides}\n"],
            capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SandboxUnavailableError(
            f"cannot read the installed packages with dpkg-query ({exc}): building the image "
            "needs a Debian or Ubuntu host") from None
    packages: dict[str, tuple[Package, list[list[str]], list[str]]] = {}
    for line in out.splitlines():
        name, version, arch, status, pre, deps, provides = line.split("\t")
        if not status.endswith(" installed"):
            continue
        groups = [[alt.split()[0].split(":")[0] for alt in dep.split("|")]
                  for dep in f"{pre}, {deps}".split(",") if dep.strip()]
        packages[name] = (Package(name, version, arch), groups,
                          [p.split()[0] for p in provides.split(",") if p.strip()])
    return packages


def closure(roots: Sequence[str]) -> list[Package]:
    """The installed packages ``roots`` need, dependencies included, sorted by name."""
    db = installed()
    providers: dict[str, str] = {}
    for name, (_, _, provides) in db.items():
        for virtual in provides:
            providers.setdefault(virtual, name)
    missing = [r for r in roots if r not in db]
    if missing:
        raise SandboxUnavailableError(
            f"the image needs these packages installed on this host: {', '.join(missing)}; "
            f"`apt-get install -y {' '.join(missing)}`")
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for group in db[name][1]:
            choice = next((alt for alt in group if alt in db), None) or next(
                (providers[alt] for alt in group if alt in providers), None)
            if choice is not None and choice not in seen:
                todo.append(choice)
    return sorted((db[n][0] for n in seen), key=lambda p: p.name)


def files_of(package: Package) -> list[str]:
    """Absolute paths dpkg installed for ``package``, minus documentation."""
    info = Path("/var/lib/dpkg/info")
    for name in (f"{package.name}:{package.arch}.list", f"{package.name}.list"):
        if (info / name).exists():
            return [p for p in (info / name).read_text().splitlines()
                    if p and p != "/." and not p.startswith(SKIP)]
    return []


def image_tag(packages: Sequence[Package]) -> str:
    digest = hashlib.sha256(BUILDER.encode())
    for p in packages:
        digest.update(f"{p.name}={p.version}:{p.arch}\n".encode())
    for path, text in sorted(SYNTHETIC.items()):
        digest.update(f"{path}\0{text}\0".encode())
    return digest.hexdigest()[:16]


class _Chunks(io.RawIOBase):
    """A write-only file whose writes are collected for a generator to hand out."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


def rootfs_tar(packages: Sequence[Package]) -> Iterator[bytes]:
    """The image's root filesystem as a stream of tar chunks."""
    sink = _Chunks()
    tar = tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT)
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):  # merged /usr links
        if os.path.islink(f"/{name}"):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(f"/{name}")
            tar.addfile(info)
    for path, mode, uid in (("etc", 0o755, 0), *DIRECTORIES):
        info = tarfile.TarInfo(path)
        info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, mode, uid, uid
        tar.addfile(info)
    for path, text in SYNTHETIC.items():
        data = text.encode()
        info = tarfile.TarInfo(path)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    if os.path.exists("/etc/ld.so.cache"):
        tar.add("/etc/ld.so.cache", "etc/ld.so.cache")
    added: set[str] = ({"etc", "etc/ld.so.cache", *SYNTHETIC, *(d for d, _, _ in DIRECTORIES)}
                       | {n for n in ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
                          if os.path.islink(f"/{n}")})
    for package in packages:
        for host_path in files_of(package):
            # Merged /usr: /bin/sh is really /usr/bin/sh; store the canonical path.
            parent = os.path.realpath(os.path.dirname(host_path))
            path = os.path.join(parent, os.path.basename(host_path)).lstrip("/")
            if path in added or path.startswith(("etc/shadow", "etc/gshadow")):
                continue
            try:
                mode = os.lstat(host_path).st_mode
            except OSError:
                continue  # listed but removed since
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                continue
            for ancestor in _ancestors(path):
                if ancestor not in added:
                    added.add(ancestor)
                    tar.add(f"/{ancestor}", ancestor, recursive=False)
            added.add(path)
            tar.add(host_path, path, recursive=False)
            if sum(len(p) for p in sink.parts) >= 1 << 20:
                yield sink.take()
    tar.close()
    yield sink.take()


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


async def build_default_image(engine: DockerAPI | None = None, *, force: bool = False,
                              on_progress: object = None) -> str:
    """Build (or find) the default image; returns its reference ``tempering/python:<tag>``."""
    engine = engine or DockerAPI()
    await engine.ping()
    packages = closure(PACKAGES)
    ref = f"{REPOSITORY}:{image_tag(packages)}"
    if not force and await engine.image_id(ref) is not None:
        return ref
    params = {"fromSrc": "-", "repo": REPOSITORY, "tag": ref.split(":")[1],
              "changes": ["WORKDIR /workspace", f"USER {USER_UID}:{USER_UID}",
                          'CMD ["/bin/sh"]', "ENV LANG=C.UTF-8"]}
    async for _ in engine.stream("POST", "/images/create", params=params,
                                 data=rootfs_tar(packages), content_type="application/x-tar",
                                 what=f"importing image {ref}"):
        pass
    if await engine.image_id(ref) is None:
        raise SandboxUnavailableError(f"the engine did not keep image {ref} after the import")
    await engine.request("POST", f"/images/{ref}/tag", params={"repo": REPOSITORY,
                                                                "tag": "latest"},
                         what=f"tagging {ref} as {REPOSITORY}:latest")
    return ref


def _context_tar(context: Path) -> bytes:
    """A build context (a directory with a Dockerfile) as a tar; links kept as links."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(context.rglob("*")):
            info = tar.gettarinfo(str(path), str(path.relative_to(context)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if info.isfile():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buffer.getvalue()


async def build_recipe(context: Path | str, tag: str | None = None, *,
                       engine: DockerAPI | None = None, force: bool = False) -> str:
    """Build a task's own image from a directory holding a Dockerfile whose FROM names a local
    image (the default one, ``tempering/python:latest``, or another built here): nothing is
    pulled. The tag defaults to ``tempering/task:<digest of the directory>``, so an unchanged
    recipe is not rebuilt. Returns the image reference."""
    import json

    context = Path(context)
    if not (context / "Dockerfile").is_file():
        raise SandboxUnavailableError(f"{context} has no Dockerfile: a recipe is a directory "
                                      "with a Dockerfile that starts FROM a local image")
    data = _context_tar(context)
    ref = tag or f"tempering/task:{hashlib.sha256(data).hexdigest()[:16]}"
    engine = engine or DockerAPI()
    if not force and await engine.image_id(ref) is not None:
        return ref
    errors: list[str] = []
    buffered = b""
    async for chunk in engine.stream("POST", "/build", params={"t": ref, "pull": False,
                                                              "rm": True, "forcerm": True},
                                     data=data, content_type="application/x-tar",
                                     what=f"building {ref} from {context}"):
        buffered += chunk
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError):
                message = json.loads(line)
                if "error" in message:
                    errors.append(str(message["error"]).strip())
    if errors:
        hint = (" (FROM must name an image on this engine, such as tempering/python:latest "
                "from `tempering image build`: nothing is pulled)"
                if any(w in e for e in errors for w in ("pull", "not found", "registry"))
                else "")
        raise SandboxUnavailableError(f"building {ref} from {context} failed: "
                                      f"{errors[-1]}{hint}")
    return ref


@dataclass(frozen=True)
class ImageFiles:
    """The regular files below a directory of an image, as its containers start with them."""

    files: dict[str, bytes]
    modes: dict[str, int]
    left_out: list[str]  # "path (why)": links, special files, past the limits
    workdir: str  # the image's working directory ("" when it sets none)
    links: dict[str, str] = field(default_factory=dict)  # symbolic links, with ``links=True``


async def image_files(ref: str, path: str | None = None, *, max_files: int = 10_000,
                      max_bytes: int = 256 << 20, engine: DockerAPI | None = None,
                      links: bool = False) -> ImageFiles:
    """What image ``ref`` holds below ``path`` (default: its working directory), read through a
    created, never started container of it, which is removed after. Links (unless ``links``
    asks for them, as links) and special files are left out and listed, never followed; past
    ``max_files`` or ``max_bytes`` the reading stops with the rest left out."""
    engine = engine or DockerAPI()
    info = (await engine.request("GET", f"/images/{ref}/json", what=f"inspecting {ref}")).json()
    workdir = str((info.get("Config") or {}).get("WorkingDir") or "")
    where = path or workdir
    if not where.startswith("/") or where == "/":
        raise SandboxUnavailableError(f"image {ref} has no working directory to read (WORKDIR "
                                      f"{workdir or 'unset'})")
    created = await engine.request("POST", "/containers/create", body={
        "Image": ref, "Cmd": ["/nonexistent"], "Entrypoint": [], "NetworkDisabled": True,
        "Labels": {"tempering.owner": owner_tag()}}, what=f"creating a container of {ref}")
    container = str(created.json()["Id"])
    try:
        data, size = [], 0
        async for chunk in engine.stream("GET", f"/containers/{container}/archive",
                                         params={"path": where},
                                         what=f"reading {where} of {ref}"):
            size += len(chunk)
            if size > max_bytes + (16 << 20):  # the files, and room for the archive's headers
                raise SandboxUnavailableError(f"{where} of image {ref} holds more than "
                                              f"{max_bytes >> 20} MiB")
            data.append(chunk)
    finally:
        await engine.remove(container)
    return _archive_files(b"".join(data), workdir, max_files, max_bytes, links)


def _archive_files(data: bytes, workdir: str, max_files: int, max_bytes: int,
                   keep_links: bool = False) -> ImageFiles:
    files: dict[str, bytes] = {}
    modes: dict[str, int] = {}
    links: dict[str, str] = {}
    left_out: list[str] = []
    total = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        for member in archive:
            name = member.name.partition("/")[2]  # the archive's top is the directory itself
            if not name or member.isdir():
                continue
            if member.issym() and keep_links and len(files) + len(links) < max_files:
                links[name] = member.linkname
            elif not member.isfile():
                why = "symbolic link" if member.issym() else "not a regular file"
                left_out.append(f"{name} ({why})")
            elif len(files) + len(links) >= max_files or total + member.size > max_bytes:
                left_out.append(f"{name} (past the limits)")
            else:
                reader = archive.extractfile(member)
                files[name] = reader.read() if reader is not None else b""
                modes[name] = member.mode & 0o7777
                total += member.size
    return ImageFiles(files, modes, left_out, workdir, links)
