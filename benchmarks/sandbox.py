"""Benchmarks of the local sandbox backend, each figure beside a baseline measured in the same run.

    .venv/bin/python benchmarks/sandbox.py [--quick] [--density N] [--cycles N] [--json PATH]
                                           [--fork-mb N] [--only cold,exec,...]

Machines are noisy, so no figure stands alone: every latency is given as p50 and p99 together
with the same percentiles of a baseline timed side by side (the two alternate run by run, so
drift, frequency scaling and neighbours hit both alike), and the ratio between them is the
figure to compare across machines. Sections:

1. cold start: open a sandbox, ``exec(["true"])``, close it; vs a plain asyncio subprocess of
   ``true`` with its output captured (what a harness without sandboxes would do).
2. live exec: ``exec(["true"])`` in a running sandbox; vs the same plain subprocess.
3. fork: fork of a sandbox holding ``--fork-mb`` MiB of files in 1 MiB files, for both storages
   (``memory`` copies, ``volume`` snapshots; the first fork, 1 s after the writes, shows what is
   left to write back); vs fork of an
   empty one (so the ratio isolates the cost of copying the files). The child's close is not timed.
4. density: N sandboxes open at once (16 opening at a time), each must answer an exec; host
   memory per sandbox is the drop in /proc/meminfo MemAvailable divided by N. Other jobs on the
   host move MemAvailable too, so the memory charged to our sandbox cgroups plus the bubblewrap
   processes' PSS is printed beside it; and the start latency of the last tenth opened is
   compared with the first tenth's, to see whether a start costs more on a crowded host.
5. throughput: K episodes (open, run a small ``python3 -c`` program, close) at concurrency 1, 8
   and 32; vs concurrency 1, and vs the same program as a plain subprocess at the same concurrency.
6. leaks: M open/exec/close cycles (8 at a time), then the processes of our sandboxes (our
   bubblewrap children, anything in our sandbox cgroups), mounts, this process's fds and
   threads, and our sandbox cgroup directories must be back where they started. The host-wide
   process count is printed too, without a verdict: other jobs start and stop processes.
7. docker: the docker backend (with the default image, if an engine answers and the image was
   built): cold start vs ``docker run --rm IMAGE true``; allocation from a warm pool, live exec,
   fork and host memory per live container vs the local backend.

Targets are printed with PASS/MISS; a MISS does not fail the run, a crash does (exit status 1).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from figures import Figure, Section, console, percentile, report, run_benchmark

from tempering.errors import SandboxUnavailableError
from tempering.sandbox import ExecResult, Sandbox, SandboxSpec, create_sandbox, open_sandbox
from tempering.sandbox.base import DEFAULT_PATH
from tempering.sandbox.host import host, storage_for, volumes

PIPE = asyncio.subprocess.PIPE
MiB = 1 << 20
PYTHON = shutil.which("python3", path=DEFAULT_PATH) or "/usr/bin/python3"  # the one inside, too
PROGRAM = "import json; print(json.dumps(sum(range(1000))))"


@dataclass(frozen=True)
class Scale:
    """How much work each section does."""

    cold_runs: int
    exec_runs: int
    fork_mb: int
    fork_runs: int
    density: int
    episodes: int
    cycles: int
    docker_runs: int


FULL = Scale(cold_runs=200, exec_runs=2000, fork_mb=100, fork_runs=30, density=1000,
             episodes=300, cycles=10_000, docker_runs=20)
QUICK = Scale(cold_runs=50, exec_runs=300, fork_mb=20, fork_runs=10, density=100,
              episodes=60, cycles=500, docker_runs=3)


# ---- measuring ----


Timed = Callable[[], Awaitable[float]]


def timed(fn: Callable[[], Awaitable[object]]) -> Timed:
    """``fn`` made to return how long it took, in ms."""
    async def run() -> float:
        start = time.perf_counter()
        await fn()
        return (time.perf_counter() - start) * 1e3
    return run


async def side_by_side(subject: Timed, baseline: Timed, runs: int,
                       warmup: int = 5) -> tuple[list[float], list[float]]:
    """Alternate subject and baseline (and which goes first), so both see the same machine."""
    for _ in range(warmup):
        await subject()
        await baseline()
    a: list[float] = []
    b: list[float] = []
    for i in range(runs):
        if i % 2:
            b.append(await baseline())
            a.append(await subject())
        else:
            a.append(await subject())
            b.append(await baseline())
    return a, b


def latency_figures(section: str, name: str, samples: list[float], base_name: str,
                    base: list[float], *, p50_ms: float | None = None,
                    p50_ratio: float | None = None) -> list[Figure]:
    """p50 and p99 of samples against the baseline's; the target applies to the p50."""
    figures = []
    for q in (50, 99):
        value, ref = percentile(samples, q), percentile(base, q)
        target, passed = "", None
        if q == 50 and p50_ms is not None:
            target, passed = f"<= {p50_ms:g} ms", value <= p50_ms
        if q == 50 and p50_ratio is not None:
            target, passed = f"<= {p50_ratio:g}x", value / ref <= p50_ratio
        figures.append(Figure(section, f"{name} p{q}", value, "ms", ref, f"{base_name} p{q}",
                              target, passed))
    return figures


async def run_bounded(count: int, limit: int,
                      job: Callable[[int], Awaitable[object]]) -> list[BaseException]:
    """Run ``job(0..count-1)`` with at most ``limit`` at once; return the errors, not raise."""
    errors: list[BaseException] = []
    indices = iter(range(count))

    async def worker() -> None:
        for i in indices:
            try:
                await job(i)
            except Exception as exc:  # a failed job is a figure, not the end of the run
                errors.append(exc)

    await asyncio.gather(*(worker() for _ in range(min(limit, count))))
    return errors


def check(result: ExecResult, stdout: str | None = None) -> None:
    if not result.ok or (stdout is not None and result.stdout.strip() != stdout):
        raise RuntimeError(f"sandbox command did not do what it should: {result}")


async def plain(*argv: str) -> bytes:
    """The baseline: a plain asyncio subprocess, output captured as ``exec`` does."""
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=PIPE, stderr=PIPE)
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} exited with {proc.returncode}")
    return out


def meminfo(key: str = "MemAvailable") -> int:
    """A /proc/meminfo value in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def own_status(key: str) -> int:
    """A number from /proc/self/status (VmRSS in kB, Threads)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


async def settle() -> None:
    """Let closed things finish going away before memory or leaks are read."""
    gc.collect()
    await asyncio.sleep(0.5)


def storages(section: str) -> list[str]:
    """The storages this host can run: ``memory`` always, ``volume`` where btrfs works."""
    try:
        volumes()
    except SandboxUnavailableError as exc:
        print(f"  {section}, storage=volume: skipped ({exc})")
        return ["memory"]
    return ["memory", "volume"]


# ---- sections ----

async def cold_start(scale: Scale, args: argparse.Namespace) -> list[Figure]:
    figures: list[Figure] = []
    for storage in storages("cold start"):
        spec = SandboxSpec(storage=storage)

        async def sandbox(spec: SandboxSpec = spec) -> None:
            async with open_sandbox(spec) as sb:
                check(await sb.exec(["true"]))

        ours, base = await side_by_side(timed(sandbox), timed(lambda: plain("true")),
                                        scale.cold_runs)
        figures += latency_figures("cold start", f"open+exec true+close, storage={storage}",
                                   ours, "subprocess true", base, p50_ms=10)
    return report(figures)


async def live_exec(scale: Scale, args: argparse.Namespace) -> list[Figure]:
    async with open_sandbox(SandboxSpec()) as sb:
        async def run() -> None:
            check(await sb.exec(["true"]))

        ours, base = await side_by_side(timed(run), timed(lambda: plain("true")),
                                        scale.exec_runs, warmup=20)
    return report(latency_figures("live exec", "exec true", ours, "subprocess true", base,
                                  p50_ratio=1.5))


async def fork(scale: Scale, args: argparse.Namespace) -> list[Figure]:
    """Fork a full workspace vs an empty one, for each storage that runs here: ``memory`` copies
    files, ``volume`` snapshots a btrfs subvolume (its first fork also writes back fresh data)."""
    mb = args.fork_mb or scale.fork_mb
    figures: list[Figure] = []
    for storage in storages("fork"):
        figures += await _fork(storage, mb, scale.fork_runs)
        if storage == "volume":
            figures += await _fork_files(10_000, scale.fork_runs)
    return report(figures)


def _forking(sb: Sandbox) -> Timed:
    async def run() -> float:
        start = time.perf_counter()
        forked = await sb.fork()
        ms = (time.perf_counter() - start) * 1e3
        await forked.close()
        return ms
    return run


async def _fork_files(count: int, runs: int) -> list[Figure]:
    """A fork runs as a uid of its own: the snapshot must show it as the owner of every file
    without costing a chown per file (an idmapped mount), so a repository-sized workspace forks
    like an empty one."""
    spec = SandboxSpec(disk_mb=256, storage="volume")
    async with open_sandbox(spec) as full, open_sandbox(spec) as empty:
        made = await full.exec(["python3", "-c", f"import os\nfor i in range({count}):\n"
                                "    os.makedirs(f'src/{i // 100}', exist_ok=True)\n"
                                "    open(f'src/{i // 100}/m{i}.py', 'w').write('x = 1\\n')"],
                               timeout=120)
        check(made)
        await asyncio.sleep(1.0)

        ours, base = await side_by_side(_forking(full), _forking(empty), runs, warmup=2)
    return latency_figures("fork", f"fork {count:,}-file workspace, storage=volume", ours,
                           "fork empty", base, p50_ms=10)


async def _fork(storage: str, mb: int, runs: int) -> list[Figure]:
    spec = SandboxSpec(disk_mb=max(256, 2 * mb), memory_mb=max(512, 3 * mb), storage=storage)
    async with open_sandbox(spec) as full, open_sandbox(spec) as empty:
        block = os.urandom(MiB)
        for i in range(mb):
            await full.write_file(f"data/{i:04d}.bin", i.to_bytes(4, "little") + block[4:])
        await asyncio.sleep(1.0)  # a moment idle, as between an agent's turns
        start = time.perf_counter()
        child = await full.fork()  # the first fork: data not yet on disk is written back first
        first_ms = (time.perf_counter() - start) * 1e3
        try:
            names = await child.list("data")
            last = await child.read_file(f"data/{mb - 1:04d}.bin")
            if len(names) != mb or last[:4] != (mb - 1).to_bytes(4, "little"):
                raise RuntimeError(f"fork copied {len(names)} of {mb} files, or copied them wrong")
        finally:
            await child.close()

        ours, base = await side_by_side(_forking(full), _forking(empty), runs, warmup=2)
    figures = latency_figures("fork", f"fork {mb} MiB workspace, storage={storage}", ours,
                              "fork empty", base, p50_ms=10)
    figures.append(Figure("fork", f"first fork 1 s after writing, storage={storage}",
                          first_ms, "ms"))
    return figures


async def density(scale: Scale, args: argparse.Namespace) -> list[Figure]:
    n = args.density or scale.density
    spec = SandboxSpec()
    await settle()
    avail, rss, charged = meminfo(), own_status("VmRSS"), charged_bytes()
    slots: list[Sandbox | None] = [None] * n
    open_ms: list[float] = []  # in the order they finished: does a start cost more when crowded?

    async def open_one(i: int) -> None:
        start = time.perf_counter()
        slots[i] = await create_sandbox(spec)
        open_ms.append((time.perf_counter() - start) * 1e3)

    start = time.perf_counter()
    open_errors = await run_bounded(n, 16, open_one)
    open_s = time.perf_counter() - start
    live = [sb for sb in slots if sb is not None]
    try:
        async def answer(i: int) -> None:
            check(await live[i].exec(["echo", str(i)]), str(i))

        exec_errors = await run_bounded(len(live), 16, answer)
        await settle()
        used = avail - meminfo()
        rss_used = (own_status("VmRSS") - rss) * 1024
        charged = charged_bytes() - charged
    finally:
        start = time.perf_counter()
        close_errors = await run_bounded(len(live), 16, lambda i: live[i].close())
        close_s = time.perf_counter() - start
    await asyncio.sleep(4.5)
    await settle()
    missing = avail - meminfo()  # the kernel frees some namespace memory lazily
    for what, errors in (("open", open_errors), ("exec", exec_errors), ("close", close_errors)):
        if errors:
            console.print(f"  [red]{len(errors)} {what} failures[/], first: {errors[0]!r}")
    answered, count = len(live) - len(exec_errors), max(len(live), 1)
    per, tenth = used / count / MiB, max(len(open_ms) // 10, 1)
    return report([
        Figure("density", f"open {n} sandboxes, 16 at a time", open_s, "s"),
        Figure("density", "sandboxes opened per second", len(live) / open_s, "/s"),
        Figure("density", "open p50 of the last tenth opened", percentile(open_ms[-tenth:], 50),
               "ms", percentile(open_ms[:tenth], 50), "first tenth"),
        Figure("density", f"live sandboxes answering exec (of {n})", answered, "",
               target=f"= {n}", passed=answered == n),
        Figure("density", "host memory per sandbox (MemAvailable)", per, "MiB",
               target="<= 2 MiB", passed=per <= 2),
        Figure("density", "  cgroup charge + bwrap PSS per sandbox", charged / count / MiB,
               "MiB"),
        Figure("density", "  harness RSS per sandbox", rss_used / count / 1024, "KiB"),
        Figure("density", f"close {len(live)} sandboxes, 16 at a time", close_s, "s"),
        Figure("density", "MemAvailable still missing 5 s after close", missing / MiB, "MiB",
               used / MiB, "taken while open"),
    ])


async def throughput(scale: Scale, args: argparse.Namespace) -> list[Figure]:
    k, spec, expected = scale.episodes, SandboxSpec(), str(sum(range(1000)))

    async def episode(_: int) -> None:
        async with open_sandbox(spec) as sb:
            check(await sb.exec([PYTHON, "-c", PROGRAM]), expected)

    async def bare(_: int) -> None:
        if (await plain(PYTHON, "-c", PROGRAM)).decode().strip() != expected:
            raise RuntimeError("the plain python3 baseline printed the wrong thing")

    async def rate(job: Callable[[int], Awaitable[None]], concurrency: int) -> float:
        start = time.perf_counter()
        errors = await run_bounded(k, concurrency, job)
        if errors:
            raise RuntimeError(f"{len(errors)} of {k} episodes failed, first: {errors[0]!r}")
        return k / (time.perf_counter() - start)

    figures, first = [], None
    for c in (1, 8, 32):
        ours, base = await rate(episode, c), await rate(bare, c)
        first = first or ours
        figures += [Figure("throughput", f"episodes/s at concurrency {c}", ours, "/s", first,
                           "concurrency 1"),
                    Figure("throughput", f"  same vs plain python3 at concurrency {c}", ours,
                           "/s", base, "plain")]
    return report(figures)


def user_processes() -> list[tuple[int, int, int, int]]:
    """(pid, ppid, session, uid) of every user-space process; kernel threads come and go alone."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                uid = entry.stat().st_uid
            except OSError:
                continue  # gone while we looked
            if not int(fields[6]) & 0x00200000:  # PF_KTHREAD
                found.append((int(entry.name), int(fields[1]), int(fields[3]), uid))
    return found


def ours(pid: int, ppid: int, session: int, uid: int) -> bool:
    """Whether a process belongs to this process's sandboxes: a bubblewrap we started, one of
    a sandbox uid left in our session (a bubblewrap orphaned mid-start), or anything in our
    sandbox cgroups. Other jobs on the host may run sandboxes too; theirs do not count."""
    uids = host().uids
    if ppid == os.getpid() or (uids.first <= uid <= uids.last and session == os.getsid(0)):
        return True
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return f"/tempering/{host().tag}/" in f.read()
    except OSError:
        return False


def charged_bytes() -> int:
    """Memory charged to our sandbox cgroups, plus the PSS of the bubblewrap processes above
    them (they stay in our own cgroup): a per-sandbox figure that other jobs cannot disturb."""
    h = host()
    owner = h.hierarchy.owner_dirs(h.tag)
    usage = (owner["memory"] / "memory.usage_in_bytes" if h.hierarchy.version == 1
             else owner[""] / "memory.current")
    total = int(usage.read_text())
    for pid, ppid, _, _ in user_processes():
        if ppid == os.getpid():
            try:
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    total += next(int(line.split()[1]) * 1024 for line in f
                                  if line.startswith("Pss:"))
            except (OSError, StopIteration):
                pass
    return total


def snapshot() -> dict[str, int]:
    """What an open/close cycle must give back, counted now."""
    h = host()
    processes = user_processes()
    with open("/proc/self/mountinfo") as f:
        mounts = sum(1 for _ in f)
    cgroups = sum(len([p for p in d.iterdir() if p.is_dir()])
                  for d in h.hierarchy.owner_dirs(h.tag).values())
    return {"host user-space processes (all jobs)": len(processes),
            "processes of our sandboxes": sum(ours(*p) for p in processes),
            "mounts (/proc/self/mountinfo)": mounts,
            "open fds of this process": len(os.listdir("/proc/self/fd")),
            "sandbox cgroup dirs": cgroups, "sandbox volumes": volume_count(),
            "threads of this process": own_status("Threads")}


def volume_count() -> int:
    """Volumes in the host's pool (0 where there is none)."""
    return len(os.listdir(volumes().root)) if storage_for("auto") == "volume" else 0


async def leaks(scale: Scale, args: argparse.Namespace) -> list[Figure]:
    m, spec = args.cycles or scale.cycles, SandboxSpec()

    async def cycle(_: int) -> None:
        async with open_sandbox(spec) as sb:
            check(await sb.exec(["true"]))

    await run_bounded(16, 8, cycle)  # lazily made things (host check, loop state) exist first
    await settle()
    before, avail = snapshot(), meminfo()
    start = time.perf_counter()
    errors = await run_bounded(m, 8, cycle)
    elapsed = time.perf_counter() - start
    for _ in range(10):  # a few seconds for stragglers; a leak stays
        await settle()
        after = snapshot()
        if all(after[k] == before[k] for k in before if not k.startswith("host")):
            break
    if errors:
        console.print(f"  [red]{len(errors)} of {m} cycles failed[/], first: {errors[0]!r}")
    drift = (avail - meminfo()) / MiB
    figures = [Figure("leaks", f"{m} open/exec/close cycles, 8 at a time", elapsed, "s"),
               Figure("leaks", "cycles per second", m / elapsed, "/s"),
               Figure("leaks", "failed cycles", len(errors), "", target="= 0",
                      passed=not errors)]
    for key, value in before.items():
        shared = key.startswith("host")  # informative only: other jobs start and stop processes
        figures.append(Figure("leaks", key, after[key], "", value, "before",
                              "" if shared else f"= {value}",
                              None if shared else after[key] == value, relative=False))
    figures.append(Figure("leaks", "MemAvailable drop over the cycles", drift, "MiB"))
    return report(figures)


async def command(*argv: str, limit_s: float = 20.0) -> tuple[int, str]:
    try:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=PIPE, stderr=PIPE)
    except OSError as exc:
        return 127, str(exc)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), limit_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return 124, f"{argv[0]} timed out after {limit_s} s"
    return proc.returncode or 0, (out or err).decode(errors="replace").strip()


async def docker(scale: Scale, args: argparse.Namespace) -> list[Figure]:
    """The docker backend beside the local one and beside ``docker run --rm``."""
    from tempering.errors import SandboxError
    from tempering.sandbox import SandboxPool
    from tempering.sandbox.docker.api import DockerAPI
    from tempering.sandbox.docker.backend import default_image

    try:
        present = await DockerAPI().image_id(default_image())
    except SandboxError as exc:
        console.print(f"  docker: skipped ({exc})")
        return []
    if present is None or shutil.which("docker") is None:
        console.print(f"  docker: skipped (no image {default_image()}, or no docker CLI for the "
                      "`docker run --rm` baseline): run `tempering image build`")
        return []
    image, spec, local_spec = default_image(), SandboxSpec(backend="docker"), SandboxSpec()
    figures: list[Figure] = []

    async def container() -> None:
        code, out = await command("docker", "run", "--rm", "--network", "none", image, "true",
                                  limit_s=60)
        if code != 0:
            raise RuntimeError(f"docker run --rm {image} true failed ({code}): {out}")

    async def sandbox() -> None:
        async with open_sandbox(spec) as sb:
            check(await sb.exec(["true"]))

    async def local_sandbox() -> None:
        async with open_sandbox(local_spec) as sb:
            check(await sb.exec(["true"]))

    ours, theirs = await side_by_side(timed(sandbox), timed(container), scale.docker_runs,
                                      warmup=1)
    figures += latency_figures("docker", "docker backend open+exec true+close", ours,
                               "docker run --rm true", theirs, p50_ratio=1.2)
    local, theirs = await side_by_side(timed(local_sandbox), timed(container), scale.docker_runs,
                                       warmup=1)
    figures += latency_figures("docker", "local backend open+exec true+close", local,
                               "docker run --rm true", theirs)

    async def allocations(pool_spec: SandboxSpec) -> list[float]:
        samples = []
        async with SandboxPool(max_instances=8, warm=2, spec=pool_spec) as pool:
            for i in range(scale.docker_runs * 4):
                while pool.stats().warm < 1:  # noqa: ASYNC110 - the pool has no "warm" event
                    await asyncio.sleep(0.01)  # allocation from the warm pool, as in training
                start = time.perf_counter()
                sb = await pool.allocate(f"t{i}", pool_spec)
                samples.append((time.perf_counter() - start) * 1e3)
                check(await sb.exec(["true"]))
                await pool.release(f"t{i}")
        return samples

    figures += latency_figures("docker", "allocate from the warm pool", await allocations(spec),
                               "local backend", await allocations(local_spec), p50_ms=5)
    async with open_sandbox(spec) as sb, open_sandbox(local_spec) as lsb:
        async def docker_exec() -> None:
            check(await sb.exec(["true"]))

        async def local_exec() -> None:
            check(await lsb.exec(["true"]))

        ours, theirs = await side_by_side(timed(docker_exec), timed(local_exec),
                                          scale.exec_runs // 4)
        figures += latency_figures("docker", "exec true in a live container", ours,
                                   "local backend", theirs, p50_ms=20)
        mb = min(args.fork_mb or scale.fork_mb, 20)
        for parent in (sb, lsb):
            check(await parent.exec(["sh", "-c", f"for i in $(seq {mb}); do head -c 1M "
                                     "/dev/urandom > f$i; done"]))
        await asyncio.sleep(1.0)  # written back, as after an agent's turn

        async def fork_of(parent: Sandbox) -> Callable[[], Awaitable[None]]:
            async def run() -> None:
                child = await parent.fork()
                await child.close()
            return run

        ours, theirs = await side_by_side(timed(await fork_of(sb)), timed(await fork_of(lsb)),
                                          scale.docker_runs, warmup=1)
        figures += latency_figures("docker", f"fork {mb} MiB workspace", ours, "local backend",
                                   theirs)
    n = scale.docker_runs * 3  # MemAvailable is noisy: enough of them to see each
    for backend_spec, name in ((spec, "docker"), (local_spec, "local")):
        await settle()
        avail = meminfo()
        live = [await create_sandbox(backend_spec) for _ in range(n)]
        await asyncio.gather(*(sb.exec(["true"]) for sb in live))
        await settle()
        used = (avail - meminfo()) / n / MiB
        await asyncio.gather(*(sb.close() for sb in live))
        if name == "docker":
            docker_mem = used
        else:
            figures.append(Figure("docker", f"host memory per live container ({n} open)",
                                  docker_mem, "MiB", used, "local sandbox"))
    return report(figures)


SECTIONS: dict[str, Callable[[Scale, argparse.Namespace], Awaitable[list[Figure]]]] = {
    "cold": cold_start, "exec": live_exec, "fork": fork, "density": density,
    "throughput": throughput, "leaks": leaks, "docker": docker,
}


# ---- running and reporting ----

def machine() -> dict[str, object]:
    h = host()
    return {"kernel": platform.release(), "cpus": len(os.sched_getaffinity(0)),
            "memory_gib": round(meminfo("MemTotal") / (1 << 30), 1),
            "python": platform.python_version(), "cgroup": f"v{h.hierarchy.version}",
            "load_1m": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs (about 2 minutes)")
    parser.add_argument("--density", type=int,
                        help="sandboxes open at once (default 1000, quick 100)")
    parser.add_argument("--cycles", type=int, help="leak-check cycles (default 10000, quick 500)")
    parser.add_argument("--fork-mb", type=int, help="MiB in the forked workspace (100, quick 20)")
    run_benchmark(parser, list(SECTIONS), "sandbox", sections, machine)


def sections(args: argparse.Namespace) -> dict[str, Section]:
    scale = QUICK if args.quick else FULL
    return {name: (lambda f=f: f(scale, args)) for name, f in SECTIONS.items()}


if __name__ == "__main__":
    main()
