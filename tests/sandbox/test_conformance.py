"""The sandbox contract, checked against every backend (see conftest.BACKENDS)."""

from __future__ import annotations

import asyncio
import os
import platform
import re
import time

import pytest

from tempering.errors import SandboxClosedError, SandboxFileNotFoundError, SandboxPathError
from tempering.sandbox import ExecResult, open_sandbox

# ---- exec ----


async def test_exec_shell_string_and_exit_code(sb) -> None:
    r = await sb.exec("echo out; echo err >&2; exit 7")
    assert isinstance(r, ExecResult)
    assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")
    assert not r.timed_out and not r.oom_killed and not r.truncated
    assert r.duration_s > 0


async def test_exec_list_runs_directly_without_shell(sb) -> None:
    r = await sb.exec(["printf", "%s|", "a b", "$HOME", "*"])
    assert r.stdout == "a b|$HOME|*|"


async def test_exec_missing_program_is_127(sb) -> None:
    r = await sb.exec(["definitely-not-a-program"])
    assert r.exit_code == 127
    assert "definitely-not-a-program" in r.stderr


async def test_exec_signal_exit_is_negative(sb) -> None:
    r = await sb.exec(["sh", "-c", "kill -TERM $$"])
    assert r.exit_code == -15


async def test_exec_stdin_env_cwd(sb) -> None:
    await sb.write_file("sub/marker", "x")
    r = await sb.exec("cat; echo; echo $GREETING; pwd", stdin="piped in", env={"GREETING": "hej"},
                      cwd="sub")
    assert r.stdout == "piped in\nhej\n/workspace/sub\n"


async def test_exec_large_stdin_and_output_roundtrip(sb) -> None:
    data = os.urandom(3 << 20).hex()  # 6 MiB of text through stdin and back
    r = await sb.exec("sha256sum", stdin=data)
    import hashlib

    assert r.stdout.split()[0] == hashlib.sha256(data.encode()).hexdigest()


async def test_exec_timeout_returns_partial_output(sb) -> None:
    start = time.perf_counter()
    r = await sb.exec("echo started; sleep 30", timeout=0.5)
    assert r.timed_out and r.exit_code is None
    assert r.stdout == "started\n"
    assert time.perf_counter() - start < 5


async def test_output_is_capped_head_and_tail(make_spec) -> None:
    async with open_sandbox(make_spec(output_limit_bytes=4096)) as sb:
        r = await sb.exec("echo FIRST; head -c 5000000 /dev/zero | tr '\\0' x; echo; echo LAST")
    assert r.truncated
    assert r.stdout.startswith("FIRST\n") and r.stdout.endswith("LAST\n")
    assert len(r.stdout) < 4096 + 200


async def test_invalid_utf8_output_never_raises(sb) -> None:
    r = await sb.exec("printf '\\377\\376ok\\200'")
    assert r.exit_code == 0 and "ok" in r.stdout


async def test_concurrent_execs_in_one_sandbox(sb) -> None:
    results = await asyncio.gather(*(sb.exec(f"sleep 0.2; echo {i}") for i in range(10)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(10)]


async def test_background_daemon_does_not_hold_exec(sb) -> None:
    start = time.perf_counter()
    r = await sb.exec("sleep 30 & echo started")
    assert r.stdout == "started\n" and time.perf_counter() - start < 5
    ps = await sb.exec("ps -eo comm")
    assert "sleep" in ps.stdout  # it lives on until the sandbox closes


async def test_cancelled_exec_kills_the_command(sb) -> None:
    task = asyncio.create_task(sb.exec("sleep 60"))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.2)
    assert "sleep" not in (await sb.exec("ps -eo comm")).stdout


async def test_python_with_pytest_is_available(sb) -> None:
    r = await sb.exec(["python3", "-c", "import pytest, sys; print(sys.version_info[0])"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "3\n"


async def test_runs_as_unprivileged_user_in_workdir(sb) -> None:
    r = await sb.exec("id -u; pwd; echo $HOME")
    uid, cwd, home = r.stdout.split()
    assert uid != "0" and cwd == "/workspace" and home == "/tmp"


async def test_nproc_reports_cpu_quota(make_spec) -> None:
    async with open_sandbox(make_spec(cpus=1.0)) as sb:
        assert (await sb.exec("nproc")).stdout.strip() == "1"


async def test_bad_exec_arguments(sb) -> None:
    with pytest.raises(ValueError, match="empty command"):
        await sb.exec("   ")
    with pytest.raises(ValueError, match="non-empty list"):
        await sb.exec([])
    with pytest.raises(ValueError, match="timeout"):
        await sb.exec("true", timeout=0)


# ---- files ----


async def test_write_read_list(sb) -> None:
    await sb.write_file("src/a.py", "print('a')\n")
    await sb.write_file("src/b.bin", b"\x00\xff")
    assert await sb.read_file("src/a.py") == b"print('a')\n"
    assert await sb.read_file("/workspace/src/b.bin") == b"\x00\xff"
    assert await sb.list("src") == ["a.py", "b.bin"]
    r = await sb.exec("python3 src/a.py && stat -c %U src/a.py")
    assert r.stdout == "a\nuser\n"


async def test_files_written_inside_are_readable_outside(sb) -> None:
    await sb.exec("mkdir -p out && echo data > out/f && echo t > /tmp/t")
    assert await sb.read_file("out/f") == b"data\n"
    assert await sb.read_file("/tmp/t") == b"t\n"


async def test_write_file_mode_and_overwrite(sb) -> None:
    await sb.write_file("run.sh", "#!/bin/sh\necho run\n", mode=0o755)
    assert (await sb.exec("./run.sh")).stdout == "run\n"
    await sb.write_file("run.sh", "#!/bin/sh\necho again\n", mode=0o755)
    assert (await sb.exec("./run.sh")).stdout == "again\n"


async def test_read_missing_file(sb) -> None:
    with pytest.raises(SandboxFileNotFoundError, match="nope.txt"):
        await sb.read_file("nope.txt")
    with pytest.raises(FileNotFoundError):
        await sb.read_file("nope.txt")


async def test_upload_download_roundtrip(sb, tmp_path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "top.txt").write_bytes(b"top")
    await sb.upload(src, "proj")
    assert await sb.list("proj") == ["pkg", "top.txt"]
    r = await sb.exec("cd proj && python3 -c 'import pkg.mod as m; print(m.X)'")
    assert r.stdout == "1\n"
    await sb.exec("echo made > proj/pkg/new.txt && ln -s /etc/passwd proj/link && mkfifo proj/p")
    out = tmp_path / "out"
    assert await sb.download("proj", out) == ["proj/link", "proj/p"]  # left behind, not followed
    assert not (out / "link").exists() and not (out / "p").exists()
    assert (out / "pkg" / "new.txt").read_text() == "made\n"
    assert (out / "top.txt").read_bytes() == b"top"


async def test_disk_limit_shared_by_workdir_and_tmp(make_spec) -> None:
    async with open_sandbox(make_spec(disk_mb=16)) as sb:
        r = await sb.exec("head -c 10M /dev/zero > /tmp/a; head -c 10M /dev/zero > big; echo $?")
        assert r.stdout.strip() != "0"
        assert "No space left" in r.stderr or "Disk quota exceeded" in r.stderr


# ---- sessions ----


async def test_session_keeps_cwd_and_env(sb) -> None:
    shell = await sb.session()
    assert (await shell.run("mkdir -p d && cd d && export X=42")).exit_code == 0
    r = await shell.run("pwd; echo $X")
    assert r.stdout == "/workspace/d\n42\n"
    assert (await shell.run("false")).exit_code == 1


async def test_session_survives_syntax_error_and_timeout(sb) -> None:
    shell = await sb.session()
    r = await shell.run("echo 'unterminated")
    assert r.exit_code != 0
    r = await shell.run("sleep 30", timeout=0.5)
    assert r.timed_out
    assert (await shell.run("echo alive")).stdout == "alive\n"


async def test_session_timeout_spares_earlier_background_jobs(sb) -> None:
    shell = await sb.session()
    await shell.run("sleep 300 >/dev/null 2>&1 &")
    await shell.run("sleep 30", timeout=0.5)
    r = await shell.run("ps -eo args")
    assert "sleep 300" in r.stdout and "sleep 30\n" not in r.stdout


async def test_session_output_without_newline(sb) -> None:
    shell = await sb.session()
    assert (await shell.run("printf abc")).stdout == "abc"


async def test_session_stuck_shell_is_closed(sb) -> None:
    shell = await sb.session()
    r = await shell.run("while :; do :; done", timeout=0.5)
    assert r.timed_out
    with pytest.raises(SandboxClosedError, match="session"):
        await shell.run("echo x")


# ---- fork and close ----


async def test_fork_copies_files_not_processes(sb) -> None:
    await sb.write_file("state.txt", "turn 3")
    await sb.exec("sleep 100 >/dev/null 2>&1 &")
    child = await sb.fork()
    try:
        assert child.id != sb.id
        assert await child.read_file("state.txt") == b"turn 3"
        assert "sleep" not in (await child.exec("ps -eo comm")).stdout
        await child.write_file("state.txt", "child")
        assert await sb.read_file("state.txt") == b"turn 3"
    finally:
        await child.close()


async def test_closed_sandbox_refuses_work(make_spec) -> None:
    sb = await open_sandbox(make_spec())
    await sb.close()
    await sb.close()  # idempotent
    assert sb.closed
    with pytest.raises(SandboxClosedError):
        await sb.exec("true")
    with pytest.raises(SandboxClosedError):
        await sb.read_file("x")


async def test_path_outside_is_refused(sb) -> None:
    for bad in ("../etc/passwd", "/etc/passwd", "a/../../x"):
        with pytest.raises(SandboxPathError, match="outside"):
            await sb.read_file(bad)


@pytest.fixture
def own_rootfs():  # type: ignore[no-untyped-def]
    """A root filesystem of the user's own: the host's /usr bound in, a /etc of its own. It
    lives where the unprivileged sandbox user can reach it (pytest's tmp_path is private)."""
    import pathlib
    import shutil
    import subprocess
    import tempfile

    base = pathlib.Path(tempfile.mkdtemp(dir="/var/tmp", prefix="tempering-rootfs-"))
    root = base / "rootfs"
    (root / "usr").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "rootfs-marker").write_text("from the custom root\n")
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    for link in ("bin", "sbin", "lib", "lib64"):
        if os.path.islink(f"/{link}"):
            os.symlink(os.readlink(f"/{link}"), root / link)
    subprocess.run(["mount", "--bind", "/usr", str(root / "usr")], check=True)
    os.chmod(base, 0o755)
    os.chmod(root, 0o755)
    try:
        yield str(root)
    finally:
        subprocess.run(["umount", str(root / "usr")], check=True)
        shutil.rmtree(base)


async def test_spec_can_name_another_root_filesystem(make_spec, own_rootfs, backend) -> None:
    if backend == "docker":
        pytest.skip("a root filesystem directory is the local backend's; docker's is its image")
    async with open_sandbox(make_spec(rootfs=own_rootfs)) as sb:
        r = await sb.exec("cat /etc/rootfs-marker; ls /etc; whoami; python3 -c 'print(1)'")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "from the custom root"
    assert "debian_version" not in lines  # the host's /etc is not there
    assert lines[-2:] == ["user", "1"]


# ---- usage ----


async def test_usage_reports_the_peaks_of_memory_and_processes(sb) -> None:
    """Both backends read the peaks from the host's cgroups (the pids peak where the kernel
    keeps one, Linux 6.1 and later): the script runner voids a verdict given when the pids
    limit was reached, which needs the peak on docker too."""
    code = ("import os, time\nx = bytearray(60 << 20)\nchildren = []\n"
            "for _ in range(12):\n    pid = os.fork()\n    if pid == 0:\n"
            "        time.sleep(1)\n        os._exit(0)\n    children.append(pid)\n"
            "for pid in children:\n    os.waitpid(pid, 0)\n")
    assert (await sb.exec(["python3", "-c", code], timeout=20)).exit_code == 0
    usage = await sb.usage()
    kernel = tuple(int(x) for x in re.findall(r"\d+", platform.release())[:2])
    if kernel >= (6, 1):
        assert usage.pids_peak is not None and 13 <= usage.pids_peak <= 64, usage
    assert usage.memory_peak_bytes is not None and usage.memory_peak_bytes >= 60 << 20, usage
