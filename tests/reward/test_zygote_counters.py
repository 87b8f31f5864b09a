"""The grading zygote and per-user kernel counters: a zygote runs as a host uid of its own, and
each of its gradings (which share that uid) gets a bounded share of the counters it could
otherwise take from the others. Real zygote, real forks, real kernel."""

from __future__ import annotations

import ast
import asyncio
import os

from tempering.reward.grader import grading_spec
from tempering.reward.runner import zygote_program
from tempering.sandbox import SandboxSpec, open_sandbox
from tempering.sandbox.local.zygote import Zygote
from tempering.sandbox.uids import uid_range
from tempering.tasks.humaneval import load_humaneval
from zygote_runs import run_in_zygote

# Takes every inotify instance it can, holds them for {hold} s, and reports.
HOG = '''import ctypes, os, time


def test_hog():
    libc = ctypes.CDLL(None, use_errno=True)
    held = []
    while len(held) < 10000:
        fd = libc.inotify_init1(0)
        if fd < 0:
            break
        held.append(fd)
    limit = open("/proc/sys/user/max_inotify_instances").read().strip()
    time.sleep({hold})
    assert False, repr({{"held": len(held), "limit": limit}})
'''

ONE = '''import ctypes


def test_one():
    fd = ctypes.CDLL(None, use_errno=True).inotify_init1(0)
    assert False, repr({"fd": fd, "errno": ctypes.get_errno()})
'''


async def _grade(zygote: Zygote, name: str, text: str, timeout: float = 20.0) -> dict:  # type: ignore[type-arg]
    run, timed_out, _, _ = await run_in_zygote(zygote, {f"tests/test_{name}.py": text}, timeout)
    assert not timed_out
    message = run.outcomes[f"tests/test_{name}.py::test_{name}"][1]
    facts: dict = ast.literal_eval(message.strip().splitlines()[-1].split(": ", 1)[1])  # type: ignore[type-arg]
    return facts


async def test_a_grading_cannot_take_the_zygotes_inotify_instances_from_another() -> None:
    zygote = Zygote(grading_spec(load_humaneval()[0]), zygote_program())
    await zygote.start()
    try:
        hog = asyncio.create_task(_grade(zygote, "hog", HOG.format(hold=3)))
        await asyncio.sleep(1.5)  # the hog holds all it could take by now
        other = await _grade(zygote, "one", ONE)
        held = await hog
    finally:
        await zygote.close()
    with open("/proc/sys/fs/inotify/max_user_instances") as f:
        host_limit = int(f.read())
    assert other["fd"] >= 0, (other, held)  # the concurrent grading still got one
    assert held["limit"] == str(max(host_limit // 16, 1))
    assert 0 < held["held"] <= host_limit // 16


PTYS = '''import os, time


def test_ptys():
    held, err = [], None
    while len(held) < 4000:
        try:
            held.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
        except OSError as exc:
            err = exc.errno
            break
    time.sleep({hold})
    assert False, repr({{"held": len(held), "errno": err}})
'''


async def test_a_zygotes_gradings_have_no_ptys_to_take_or_share() -> None:
    """Ptys come out of one machine-wide count, and a devpts shared by a zygote's gradings (one
    uid) would let one open another's terminal: gradings have none, and the host and other
    sandboxes keep theirs."""
    zygote = Zygote(grading_spec(load_humaneval()[0]), zygote_program())
    await zygote.start()
    try:
        held = await _grade(zygote, "ptys", PTYS.format(hold=0))
    finally:
        await zygote.close()
    assert held == {"held": 0, "errno": 2}, held  # ENOENT: no /dev/pts/ptmx
    os.close(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))  # the host's own
    async with open_sandbox(SandboxSpec(backend="local")) as sb:
        r = await sb.exec(["python3", "-c", "import os; os.open('/dev/ptmx', os.O_RDWR)"])
        assert r.exit_code == 0, r


async def test_each_zygote_runs_as_a_host_uid_of_its_own() -> None:
    uids = uid_range()
    program = zygote_program()
    first = Zygote(grading_spec(load_humaneval()[0]), program)
    second = Zygote(SandboxSpec(), program)
    await first.start()
    await second.start()
    try:
        async with open_sandbox(SandboxSpec(backend="local")) as sb:
            seen = [_uid(first._pid), _uid(second._pid), _uid(sb._init_pid)]  # type: ignore[attr-defined]
    finally:
        await first.close()
        await second.close()
    assert len(set(seen)) == 3 and all(uids.first <= u <= uids.last for u in seen), seen


def _uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    return int(status["Uid"].split()[0])


IPC = '''import ctypes


def test_ipc():
    libc = ctypes.CDLL(None, use_errno=True)
    sid = libc.shmget(0, 1 << 20, 0o1600)  # made, never attached: gone when its maker is
    read = {name: open(f"/proc/sys/kernel/{name}").read().split()
            for name in ("shm_rmid_forced", "msgmni", "sem")}
    assert False, repr({"sid": sid, **read})
'''


async def test_a_gradings_sysv_objects_go_with_its_processes() -> None:
    """As in a sandbox's init (round twenty-nine): each grading's IPC namespace forces a
    segment's removal with its last user and holds few queues and semaphore sets."""
    zygote = Zygote(grading_spec(load_humaneval()[0]), zygote_program())
    await zygote.start()
    try:
        facts = await _grade(zygote, "ipc", IPC)
    finally:
        await zygote.close()
    assert facts["sid"] >= 0
    assert facts["shm_rmid_forced"] == ["1"] and facts["msgmni"] == ["16"]
    assert facts["sem"] == ["250", "8000", "32", "32"]
