"""``tempering doctor``: can this host run local sandboxes, and what to do if not."""

from __future__ import annotations


async def doctor_checks() -> list[tuple[str, bool | None, str]]:
    """(check, passed, details or the fix); None: skipped because an earlier check failed."""
    import time

    from tempering.sandbox import SandboxSpec, open_sandbox
    from tempering.sandbox.host import host, volumes, why_no_volumes

    names = ["local backend prerequisites", "start a sandbox", "storage", "python3 in the sandbox",
             "pytest in the sandbox", "memory limit enforced"]
    rows: list[tuple[str, bool | None, str]] = []

    def skip_rest() -> list[tuple[str, bool | None, str]]:
        return rows + [(n, None, "skipped") for n in names[len(rows):]]

    try:
        h = host()
    except Exception as exc:  # whatever stops the backend is this check's finding
        rows.append((names[0], False, str(exc)))
        return skip_rest()
    rows.append((names[0], True, f"bubblewrap {h.bwrap}, root, user namespaces, "
                                  f"cgroup v{h.hierarchy.version}, sandbox uids "
                                  f"{h.uids.first}-{h.uids.last}"))
    spec = SandboxSpec(memory_mb=128, timeout_s=30)
    start = time.perf_counter()
    try:
        sandbox = await open_sandbox(spec)
    except Exception as exc:
        rows.append((names[1], False, f"{exc}; run `tempering reclaim` and try again"))
        return skip_rest()
    async with sandbox:
        rows.append((names[1], True, f"started in {(time.perf_counter() - start) * 1000:.0f} ms"))
        why = why_no_volumes()
        rows.append((names[2], True, "auto is volume: copy-on-write btrfs volumes at "
                     f"{volumes().root}, fork is a snapshot" if why is None else
                     f"auto is memory (fork copies the files): no volumes because {why}"))
        checks = [
            ("python3 --version", "install Python 3 on the host (`apt-get install -y python3`); "
                                  "sandboxes see the host's system read-only"),
            ("python3 -c 'import pytest; print(\"pytest\", pytest.__version__)'",
             "install pytest for the host's python3 (`apt-get install -y python3-pytest`)"),
        ]
        for name, (cmd, fix) in zip(names[3:5], checks, strict=True):
            result = await sandbox.exec(cmd)
            if not result.ok:
                why = result.stderr.strip()[-120:] or f"exit {result.exit_code}"
                rows.append((name, False, f"`{cmd}` failed ({why}); {fix}"))
                return skip_rest()
            rows.append((name, True, result.stdout.strip()))
        result = await sandbox.exec(["python3", "-c", "b'x' * (512 << 20)"])
        if result.oom_killed:
            rows.append((names[5], True, "512 MB in a 128 MB sandbox was killed"))
        else:
            rows.append((names[5], False, f"512 MB in a 128 MB sandbox was not killed "
                         f"(exit {result.exit_code}); check that the cgroup memory controller "
                         "is enabled"))
    rows.append(await grading_check())
    rows.append(await network_check())
    rows.append(await docker_check())
    return rows


async def grading_check() -> tuple[str, bool | None, str]:
    """A grading sandbox (``tracing`` off) starts: it needs Landlock to refuse writes below
    /proc, so that no process of a grading reaches into another."""
    from tempering.sandbox import SandboxSpec, open_sandbox

    name = "grading sandbox (processes kept apart)"
    try:
        async with open_sandbox(SandboxSpec(memory_mb=128, timeout_s=30, tracing=False)) as sb:
            result = await sb.exec(["sh", "-c", "echo x > /proc/self/comm"])
    except Exception as exc:
        return (name, False, f"{exc}; grading sandboxes need Landlock (Linux 5.13 or later, "
                             "with landlock in the kernel's lsm= list)")
    if result.ok:
        return (name, False, "a write below /proc was allowed: the init's Landlock domain is "
                             "missing")
    return (name, True, "ptrace attach, pidfd_getfd, process_vm_* and writes below /proc "
                        "refused")


async def network_check() -> tuple[str, bool | None, str]:
    """``network=True`` is optional: without slirp4netns it is skipped (–), with the fix."""
    import time

    from tempering.errors import SandboxUnavailableError
    from tempering.sandbox import SandboxSpec, open_sandbox

    name = "network=True sandboxes (optional)"
    start = time.perf_counter()
    try:
        sandbox = await open_sandbox(SandboxSpec(network=True, memory_mb=128, timeout_s=30))
    except SandboxUnavailableError as exc:
        return name, None, str(exc)
    except Exception as exc:
        return name, False, str(exc)
    async with sandbox:
        took = (time.perf_counter() - start) * 1000
        # A sandbox has no netlink socket: its routes are read from here, in its namespace.
        netns = f"--net=/proc/{sandbox._init_pid}/ns/net"  # type: ignore[attr-defined]
        route = await _run("nsenter", netns, "ip", "-4", "route", "show", "default")
        refused = await _run("nsenter", netns, "ip", "route", "get", "169.254.169.254")
    if "dev tap0" not in route[1] or refused[0] == 0:
        return name, False, (f"the sandbox's routes are wrong (default: {route[1].strip()!r};"
                             f" metadata: {refused[1].strip() or refused[2].strip()!r})")
    return name, True, (f"started in {took:.0f} ms through slirp4netns; link-local, private "
                        "ranges and this host refused inside")


async def _run(*argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of a host command."""
    import asyncio

    try:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
    except OSError as exc:
        return 127, "", f"{argv[0]}: {exc}"
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


async def docker_check() -> tuple[str, bool | None, str]:
    """The docker backend is optional: without an engine or image it is skipped (–), with
    the fix, and the local backend is still ready."""
    from tempering.errors import SandboxError
    from tempering.sandbox.docker.api import DockerAPI
    from tempering.sandbox.docker.backend import default_image

    name = "docker backend (optional)"
    try:
        engine = DockerAPI()
        version = await engine.ping()
        image = await engine.image_id(default_image())
    except SandboxError as exc:
        return name, None, str(exc)
    if image is None:
        return name, None, f"engine {version}, but no image {default_image()}: run " \
                           "`tempering image build`"
    return name, True, f"engine {version} at {engine.path}, image {default_image()}"
