"""The ``tempering`` command line, run for real: subprocesses of ``python -m tempering.cli``
(and ``main()`` in this process where only argument handling is under test), against real
local sandboxes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tempering import __version__
from tempering.cli import main


def tempering(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "COLUMNS": "120"}
    return subprocess.run([sys.executable, "-m", "tempering.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


# ---- help and version ----

@pytest.mark.parametrize(("command", "mentions"), [
    ([], ["demo", "sandbox", "grade", "tasks", "doctor", "reclaim", "--version"]),
    (["grade"], ["TASK_DIR", "--workspace", "--overlay", "--json", "examples:"]),
    (["tasks"], ["validate"]),
    (["tasks", "validate"], ["humaneval", "--concurrency", "--all", "examples:"]),
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
        from tempering.sandbox.local.backend import volumes

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
    removed = re.match(r"cleaned up (\d+) sandbox\(es\) left by crashed tempering processes\n"
                       r"(removed \d+ container\(s\) left by crashed tempering processes\n)?$",
                       proc.stdout)
    assert removed and int(removed.group(1)) >= 1, proc.stdout
    volumes_dir = "/var/lib/tempering/volumes"
    if storage == "volume":
        assert not [v for v in os.listdir(volumes_dir) if v.startswith(f"{pid}-")]


def test_sandbox_run_on_a_volume_and_bad_storage() -> None:
    from tempering.errors import SandboxUnavailableError
    from tempering.sandbox.local.backend import volumes

    try:
        volumes()
    except SandboxUnavailableError as exc:
        pytest.skip(f"volume storage unavailable: {exc}")
    proc = tempering("sandbox", "run", "--storage", "volume", "--", "sh", "-c",
                     "echo hi > f && cat f")
    assert (proc.returncode, proc.stdout) == (0, "hi\n"), proc.stderr
    proc = tempering("sandbox", "run", "--storage", "disk", "--", "true")
    assert proc.returncode == 2 and "--storage disk" in proc.stderr


# ---- grade and tasks validate ----

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "tasks"


def test_grade_prints_a_table_and_json(tmp_path: Path) -> None:
    import json
    import shutil

    workspace = tmp_path / "ws"
    shutil.copytree(EXAMPLES / "median" / "workspace", workspace)
    shutil.copy(EXAMPLES / "median" / "solution" / "stats.py", workspace / "stats.py")
    proc = tempering("grade", str(EXAMPLES / "median"), "--workspace", str(workspace))
    assert proc.returncode == 0, proc.stderr
    assert "reward" in proc.stderr and "5/5 passed" in proc.stderr
    result = json.loads(proc.stdout)
    assert result["reward"] == 1.0 and result["tests_total"] == 5
    (workspace / "conftest.py").write_text("x = 1\n")
    proc = tempering("grade", str(EXAMPLES / "median"), "--workspace", str(workspace), "--json")
    result = json.loads(proc.stdout)
    assert result["reward"] == 0.0 and "conftest" in result["flags"] and proc.stderr == ""


def test_grade_overlay_and_bad_input(tmp_path: Path) -> None:
    import json

    proc = tempering("grade", str(EXAMPLES / "slugify"), "--overlay", "--workspace",
                     str(EXAMPLES / "slugify" / "solution"), "--json")
    assert json.loads(proc.stdout)["reward"] == 1.0, proc.stderr
    proc = tempering("grade", str(tmp_path), "--workspace", str(tmp_path))
    assert proc.returncode == 2 and "no task.toml" in proc.stderr
    proc = tempering("grade", str(EXAMPLES / "median"), "--workspace", str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert "--workspace" in proc.stderr and "not a directory" in proc.stderr


def test_tasks_validate_accepts_the_examples_and_names_what_is_wrong(tmp_path: Path) -> None:
    import shutil

    proc = tempering("tasks", "validate", *[str(p) for p in sorted(EXAMPLES.iterdir())], "--all")
    assert proc.returncode == 0, proc.stderr
    assert "median" in proc.stderr and "2 task(s) valid" in proc.stderr
    broken = tmp_path / "broken"
    shutil.copytree(EXAMPLES / "median", broken)
    (broken / "solution" / "stats.py").write_text("def median(values):\n    return 0\n")
    proc = tempering("tasks", "validate", str(broken))
    assert proc.returncode == 1
    assert "reference solution scores 0.000" in proc.stderr
    assert "1 of 1 task(s) invalid" in proc.stderr


def test_sandbox_run_on_the_docker_backend_and_bad_combinations() -> None:
    from tempering.errors import SandboxError
    from tempering.sandbox.docker.api import DockerAPI
    from tempering.sandbox.docker.backend import default_image
    from tempering.sandbox.uids import uid_range

    proc = tempering("sandbox", "run", "--image", "x", "--", "true")
    assert proc.returncode == 2
    assert proc.stderr == ("tempering: error: image='x' is for the docker backend; the local "
                           "backend takes a root filesystem (rootfs)\n")
    import asyncio

    try:
        present = asyncio.run(DockerAPI().image_id(default_image()))
    except SandboxError as exc:
        pytest.skip(f"docker backend unavailable: {exc}")
    if present is None:
        pytest.skip(f"no image {default_image()}: run `tempering image build`")
    proc = tempering("sandbox", "run", "--backend", "docker", "--", "sh", "-c", "id -un; id -u")
    assert proc.returncode == 0 and proc.stdout.split()[0] == "user", proc.stderr
    uids = uid_range()  # a host uid of its own: the engine maps none
    assert uids.first <= int(proc.stdout.split()[1]) <= uids.last
    proc = tempering("sandbox", "run", "--backend", "docker", "--image", "tempering/none:1",
                     "--", "true")
    assert proc.returncode == 125 and "tempering image build" in proc.stderr
