"""The ``tempering`` command line, run for real: subprocesses of ``python -m tempering.cli``
(and ``main()`` in this process where only argument handling is under test), against real
local sandboxes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from tempering import __version__
from tempering.cli import main


def tempering(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "COLUMNS": "120"}
    return subprocess.run([sys.executable, "-m", "tempering.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


# ---- help and version ----

@pytest.mark.parametrize(("command", "mentions"), [
    ([], ["demo", "sandbox", "doctor", "reclaim", "--version"]),
    (["demo"], ["--episodes", "--concurrency", "--memory-mb", "--cpus", "examples:"]),
    (["sandbox"], ["run"]),
    (["sandbox", "run"], ["--memory-mb", "--cpus", "--pids", "--disk-mb", "--network",
                          "--timeout", "124", "examples:"]),
    (["doctor"], ["bubblewrap", "pytest"]),
    (["reclaim"], ["crashed"]),
])
def test_help_of_every_command(command: list[str], mentions: list[str],
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: tempering {' '.join(command)}".rstrip() + " ")
    for word in mentions:
        assert word in out, f"{word!r} missing from `tempering {' '.join(command)} --help`"


def test_sandbox_options_are_documented_by_the_spec(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sandbox", "run", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # SandboxSpec's field docstrings and defaults, not a second copy that could drift.
    assert "a fork bomb stops here. (default: 128)" in out
    assert "files in the workdir and /tmp included. (default: 512)" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"tempering {__version__}"


# ---- sandbox run ----

def test_sandbox_run_prints_the_commands_output() -> None:
    proc = tempering("sandbox", "run", "--", "echo", "hi")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "hi\n", "")


def test_sandbox_run_passes_options_through_to_the_command() -> None:
    proc = tempering("sandbox", "run", "--", "sh", "-c", "echo out; echo err >&2; ls -d /workspace")
    assert proc.returncode == 0
    assert proc.stdout == "out\n/workspace\n"
    assert proc.stderr == "err\n"


@pytest.mark.parametrize("code", [0, 1, 3, 42])
def test_sandbox_run_exits_with_the_commands_exit_code(code: int) -> None:
    assert tempering("sandbox", "run", "--", "sh", "-c", f"exit {code}").returncode == code


def test_sandbox_run_timeout_exits_124_and_kills_the_command() -> None:
    start = time.monotonic()
    proc = tempering("sandbox", "run", "--timeout", "0.5", "--", "sleep", "30")
    assert proc.returncode == 124
    assert "timed out after 0.5 s" in proc.stderr
    assert time.monotonic() - start < 15


def test_sandbox_run_memory_limit_kills_with_137() -> None:
    proc = tempering("sandbox", "run", "--memory-mb", "64", "--",
                     "python3", "-c", "b'x' * (256 << 20)")
    assert proc.returncode == 137
    assert "--memory-mb 64" in proc.stderr


def test_sandbox_run_missing_program_exits_127() -> None:
    proc = tempering("sandbox", "run", "--", "no-such-program")
    assert proc.returncode == 127
    assert "no-such-program" in proc.stderr


# ---- bad input: one line naming the value, exit 2, no traceback ----

@pytest.mark.parametrize(("args", "names"), [
    (["sandbox", "run", "--memory-mb", "-5", "--", "true"], ["--memory-mb", "-5"]),
    (["sandbox", "run", "--cpus", "99", "--", "true"], ["--cpus", "99"]),
    (["sandbox", "run", "--pids", "2", "--", "true"], ["--pids", "2"]),
    (["sandbox", "run", "--timeout", "0", "--", "true"], ["--timeout", "0"]),
    (["sandbox", "run", "--memory-mb", "lots", "--", "true"], ["--memory-mb", "lots"]),
    (["sandbox", "run"], ["command"]),
    (["demo", "--cpus", "99"], ["--cpus", "99"]),
    (["demo", "--memory-mb", "-5"], ["--memory-mb", "-5"]),
    (["demo", "--episodes", "0"], ["--episodes", "0"]),
    (["demo", "--concurrency", "-1"], ["--concurrency", "-1"]),
    (["no-such-command"], ["no-such-command"]),
])
def test_bad_input_is_one_clear_line(args: list[str], names: list[str]) -> None:
    proc = tempering(*args)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for name in names:
        assert name in lines[0]


# ---- demo, doctor, reclaim ----

def test_demo_runs_every_episode_as_expected_and_prints_the_summary() -> None:
    proc = tempering("demo", "--episodes", "30", "--concurrency", "8")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "Latency per phase (ms)" in out and "Outcomes" in out
    for phase, count in [("allocate", 30), ("exec", 29), (r"exec \(oom\)", 1), ("release", 30)]:
        assert re.search(rf"│ {phase} +│ +{count} │", out), phase
    assert re.search(r"│ ok +│ ok +│ +29 │ +✓ +│", out)
    assert re.search(r"│ oom +│ oom +│ +1 │ +✓ +│", out)  # episode 24 eats memory
    assert "30 episodes in" in out
    assert "every episode had its expected outcome" in out


def test_doctor_passes_on_this_host() -> None:
    proc = tempering("doctor")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for check in ("local backend prerequisites", "start a sandbox", "python3 in the sandbox",
                  "pytest in the sandbox", "memory limit enforced"):
        assert re.search(rf"{check} +│ ✓", proc.stdout), check
    assert "✓ ready" in proc.stdout


@pytest.mark.parametrize("storage", ["memory", "volume"])
def test_reclaim_removes_what_a_crashed_process_left(storage: str) -> None:
    if storage == "volume":
        from tempering.errors import SandboxUnavailableError
        from tempering.sandbox.local import volumes

        try:
            volumes()
        except SandboxUnavailableError as exc:
            pytest.skip(f"volume storage unavailable: {exc}")
    crash = ("import asyncio, os\n"
             "from tempering.sandbox import SandboxSpec, open_sandbox\n"
             "async def main():\n"
             f"    await open_sandbox(SandboxSpec(storage={storage!r}))\n"
             "    print(os.getpid(), flush=True)\n"
             "    os._exit(1)  # no cleanup: the sandbox's cgroups (and volume) stay behind\n"
             "asyncio.run(main())\n")
    run = subprocess.run([sys.executable, "-c", crash], timeout=60, capture_output=True, text=True)
    assert run.returncode == 1, run.stderr
    pid = run.stdout.strip()
    proc = tempering("reclaim")
    assert proc.returncode == 0, proc.stderr
    removed = re.fullmatch(r"cleaned up (\d+) sandbox\(es\) left by crashed tempering processes\n",
                           proc.stdout)
    assert removed and int(removed.group(1)) >= 1, proc.stdout
    volumes_dir = "/var/lib/tempering/volumes"
    if storage == "volume":
        assert not [v for v in os.listdir(volumes_dir) if v.startswith(f"{pid}-")]


def test_sandbox_run_on_a_volume_and_bad_storage() -> None:
    from tempering.errors import SandboxUnavailableError
    from tempering.sandbox.local import volumes

    try:
        volumes()
    except SandboxUnavailableError as exc:
        pytest.skip(f"volume storage unavailable: {exc}")
    proc = tempering("sandbox", "run", "--storage", "volume", "--", "sh", "-c",
                     "echo hi > f && cat f")
    assert (proc.returncode, proc.stdout) == (0, "hi\n"), proc.stderr
    proc = tempering("sandbox", "run", "--storage", "disk", "--", "true")
    assert proc.returncode == 2 and "--storage disk" in proc.stderr
