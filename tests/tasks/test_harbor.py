"""Harbor (Terminal-Bench 2) task directories load as they are and grade for real: tasks
modelled on Terminal-Bench's (a CLI a bash script checks, a service config to repair, a C build
to fix), written here in harbor's layout, on the local backend (Dockerfiles that only copy
files) and the docker backend (the image built from the Dockerfile, its WORKDIR read out of
it). The solution (solve.sh, run in the agent's sandbox) scores 1, the untouched environment
0, the hacks 0; what the format has that cannot run here is refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from attempts import attempt
from tempering.errors import ConfigError
from tempering.reward import Grader, RewardResult
from tempering.reward.validate import validate_task
from tempering.tasks import Task, load_task

TASK_TOML = """version = "1.0"

[metadata]
author_name = "Test Author"
difficulty = "easy"
category = "{category}"
tags = ["bash"]

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 300.0

[environment]
build_timeout_sec = 600.0
cpus = 1
memory_mb = 512
storage_mb = 256
"""

CLI = {
    "instruction.md": "Write /app/wc.py: `python3 wc.py FILE` prints how many words FILE holds.\n",
    "environment/Dockerfile": "FROM tempering/python:latest\nWORKDIR /app\nCOPY README.md /app/\n",
    "environment/README.md": "# wc\n\nA word counter, to be written.\n",
    "tests/input.txt": "the quick brown fox\njumps over  the\n",
    "tests/test.sh": """#!/bin/bash
cd /app
out=$(python3 wc.py /tests/input.txt 2>/dev/null)
if [ "$out" = "7" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
""",
    "solution/solve.sh": """#!/bin/bash
cat > /app/wc.py <<'EOF'
import sys

print(len(open(sys.argv[1]).read().split()))
EOF
""",
}

SERVICE = {
    "instruction.md": "The service in /app does not answer on port 8080. Repair its config.\n",
    "environment/Dockerfile": ("FROM tempering/python:latest\nWORKDIR /app\n"
                               "COPY server.py service.conf /app/\n"),
    "environment/server.py": """import http.server
import json

config = json.load(open("service.conf"))


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(config["greeting"].encode())

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", config["port"]), Handler).serve_forever()
""",
    "environment/service.conf": '{"port": 8000, "greeting": "ready"}\n',
    "tests/test.sh": """#!/bin/bash
cd /app
python3 server.py > /tmp/server.log 2>&1 &
get='import urllib.request as u; print(u.urlopen("http://127.0.0.1:8080").read().decode())'
for i in $(seq 50); do
  got=$(python3 -c "$get" 2>/dev/null) && break
  sleep 0.1
done
kill $! 2>/dev/null
if [ "$got" = "ready" ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
""",
    "solution/solve.sh": "#!/bin/bash\nsed -i 's/8000/8080/' /app/service.conf\n",
}

C_BUILD = {
    "instruction.md": "`cc -o hello main.c` fails in /app. Fix the build.\n",
    "environment/Dockerfile": "FROM tempering/python:latest\nWORKDIR /app\nCOPY src/ /app/\n",
    "environment/src/main.c": ('#include <stdio.h>\n\nint main(void) {\n'
                               '    printf("hello, world\\n")\n    return 0;\n}\n'),
    "tests/test.sh": """#!/bin/bash
cd /app
if cc -o /tmp/hello main.c 2>/tmp/cc.log && [ "$(/tmp/hello)" = "hello, world" ]; then
  printf '{"reward": 1, "builds": 1}' > /logs/verifier/reward.json
else
  printf '{"reward": 0, "builds": 0}' > /logs/verifier/reward.json
fi
""",
    "solution/solve.sh": "#!/bin/bash\nsed -i 's/\\\\n\")$/\\\\n\");/' /app/main.c\n",
}


def harbor_task(root: Path, files: dict[str, str], category: str = "software") -> Path:
    for path, text in {"task.toml": TASK_TOML.format(category=category), **files}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


async def graded(task: Task, changes: dict[str, str]) -> RewardResult:
    async with Grader() as grader:
        return await grader.grade_files(task, task.workspace.overlay(
            {p: t.encode() for p, t in changes.items()}))


def test_a_harbor_task_loads_as_a_script_graded_task(tmp_path: Path) -> None:
    task = load_task(harbor_task(tmp_path / "hello-cli", CLI), backend="local")
    assert task.id == "harbor/hello-cli" and task.family == "software"
    assert task.sandbox.workdir == "/app" and task.sandbox.memory_mb == 512
    assert task.sandbox.disk_mb == 256 and task.sandbox.network is False
    grading = task.config.grading
    assert (grading.runner, grading.command, grading.tests_dir, grading.timeout_s) == (
        "script", "bash /tests/test.sh", "/tests", 60.0)
    assert dict(task.workspace.items()) == {"README.md": CLI["environment/README.md"].encode()}
    assert set(task.tests) == {"test.sh", "input.txt"}
    assert task.solve is not None and "solve.sh" in task.solve and task.solution is None
    assert "Write /app/wc.py" in task.instruction
    assert "agent timeout 300.0 s" in task.config.task.description


@pytest.mark.parametrize("files", [CLI, SERVICE, C_BUILD], ids=["cli", "service", "c-build"])
async def test_harbor_tasks_grade_solution_1_untouched_0_on_the_local_backend(
        tmp_path: Path, files: dict[str, str]) -> None:
    task = load_task(harbor_task(tmp_path / "t", files), backend="local")
    async with Grader() as grader:
        validation = await validate_task(task, grader)
    assert validation.ok, (validation.problems, validation.solution and validation.solution.log)
    assert validation.solution is not None and validation.solution.flags == []
    assert validation.untouched is not None and validation.untouched.reward == 0.0


HACKS = {
    "writes the verdict": """import os
for p in ("/logs/verifier/reward.txt", "/logs/verifier/reward.json", "/logs/.tempering/reward.txt"):
    try:
        open(p, "w").write("1")
    except OSError:
        pass
print(0)
""",
    "leaves a writer": """import os, time
if os.fork() == 0:
    os.setsid()
    os.close(1)
    end = time.monotonic() + 5
    while time.monotonic() < end:
        for p in ("/logs/verifier/reward.txt", "/logs/.tempering/reward.txt"):
            try:
                if open(p).read() != "1":
                    open(p, "w").write("1")
            except OSError:
                pass
    os._exit(0)
print(0)
""",
    "replaces the link": """import os
os.remove("/logs/verifier/reward.txt")
open("/logs/verifier/reward.txt", "w").write("1")
print(0)
""",
}


@pytest.mark.parametrize("hack", HACKS, ids=list(HACKS))
async def test_a_harbor_tasks_hacks_score_0(tmp_path: Path, hack: str) -> None:
    task = load_task(harbor_task(tmp_path / "hello-cli", CLI), backend="local")
    result = await graded(task, {"wc.py": HACKS[hack]})
    assert result.reward == 0.0, (result.flags, result.log)
    if hack == "replaces the link":
        assert "reward_replaced" in result.flags and result.tampered


async def test_nothing_the_agent_leaves_in_its_own_sandbox_reaches_the_verifier(
        tmp_path: Path) -> None:
    task = load_task(harbor_task(tmp_path / "hello-cli", CLI), backend="local")
    result = await attempt(task, shell="mkdir -p /logs/verifier && echo 1 > "
                           "/logs/verifier/reward.txt && printf 'print(7)\\n' > "
                           "/tests/input.txt; printf 'print(0)\\n' > wc.py")
    assert result.reward == 0.0 and result.flags == []


@pytest.mark.parametrize(("extra", "error"), [
    ({"environment/docker-compose.yaml": "services: {}\n"}, "several containers"),
    ({"task.toml": TASK_TOML.format(category="x") + "\n[verifier.judge]\nmodel = 'gpt'\n"},
     "an LLM judge is not supported"),
    ({"task.toml": TASK_TOML.format(category="x") + "\n[[steps]]\nname = 'one'\n"},
     "multi-step tasks are not supported"),
    ({"task.toml": TASK_TOML.format(category="x").replace("cpus = 1", "cpus = 1\ngpus = 1")},
     "sandboxes here have no GPU"),
    ({"environment/Dockerfile": "FROM tempering/python:latest\nCOPY README.md /app/\n"},
     "sets no WORKDIR"),
    ({"environment/Dockerfile": "FROM tempering/python:latest\nWORKDIR /app\nRUN true\n"},
     "needs its image built"),
    ({"task.toml": TASK_TOML.format(category="x").replace("memory_mb = 512",
                                                          "memory = 'lots'")},
     "is not a size such as '4G'"),
    ({"task.toml": TASK_TOML.format(category="x") + "\n[tempering]\ntracing = 'yes'\n"},
     "tracing must be true or false, not 'yes'"),
    ({"task.toml": TASK_TOML.format(category="x") + "\n[tempering]\ncaptures = []\n"},
     "captures: unknown keys"),
])
def test_what_cannot_run_here_is_refused_with_the_reason(tmp_path: Path, extra: dict[str, str],
                                                         error: str) -> None:
    root = harbor_task(tmp_path / "t", CLI)
    for path, text in extra.items():
        (root / path).write_text(text)
    with pytest.raises(ConfigError, match=error):
        load_task(root, backend="local")


def test_tracing_is_off_in_grading_unless_the_task_turns_it_on(tmp_path: Path) -> None:
    from tempering.reward import grading_spec

    root = harbor_task(tmp_path / "t", CLI)
    assert grading_spec(load_task(root, backend="local")).tracing is False
    (root / "task.toml").write_text(TASK_TOML.format(category="x") +
                                    "\n[tempering]\ntracing = true\n")
    task = load_task(root, backend="local")
    assert task.config.grading.tracing and grading_spec(task).tracing
    assert task.sandbox.tracing  # the agent's own sandbox is never changed


def test_memory_and_storage_spelled_as_sizes(tmp_path: Path) -> None:
    root = harbor_task(tmp_path / "t", CLI)
    (root / "task.toml").write_text(TASK_TOML.format(category="x").replace(
        "memory_mb = 512", 'memory = "1G"').replace("storage_mb = 256", 'storage = "512M"'))
    task = load_task(root, backend="local")
    assert (task.sandbox.memory_mb, task.sandbox.disk_mb) == (1024, 512)


@pytest.mark.docker
@pytest.mark.slow  # CI's slow half: image builds and containers
@pytest.mark.parametrize("files", [CLI, SERVICE], ids=["cli", "service"])
async def test_harbor_tasks_on_the_docker_backend(tmp_path: Path, files: dict[str, str],
                                                  docker_ready: None) -> None:
    built = "USER root\nRUN mkdir -p /app/data && echo seed > /app/data/seed.txt\n"
    root = harbor_task(tmp_path / "t", {**files, "environment/Dockerfile": files[
        "environment/Dockerfile"] + built})
    task = load_task(root)
    assert task.sandbox.backend == "docker" and task.sandbox.workdir == "/app"
    assert task.workspace["data/seed.txt"] == b"seed\n"  # read out of the built image
    async with Grader() as grader:
        validation = await validate_task(task, grader)
    assert validation.ok, (validation.problems, validation.solution and validation.solution.log)
    if files is CLI:
        for hack in HACKS.values():
            assert (await graded(task, {"wc.py": hack})).reward == 0.0


async def test_an_episode_plays_a_harbor_task(tmp_path: Path) -> None:
    """Rollouts take harbor tasks as any other: the agent's tools act in /app, its verdict
    comes from the task's test script; a reward it leaves in its own /logs is nothing."""
    from tempering.agent import run_episode
    from tempering.policy.scripted import ScriptedPolicy
    from tempering.trajectory.schema import Status

    task = load_task(harbor_task(tmp_path / "hello-cli", CLI), backend="local")
    solve = CLI["solution/solve.sh"].split("<<'EOF'\n", 1)[1].rsplit("EOF", 1)[0]
    honest = [("bash", {"command": "pwd"}), ("write_file", {"path": "wc.py", "content": solve}),
              ("submit", {})]
    cheat = [("bash", {"command": "mkdir -p /logs/verifier && echo 1 > "
                                  "/logs/verifier/reward.txt && echo print 7 > wc.py"}),
             ("submit", {})]
    async with Grader() as grader:
        solved = await run_episode(task, ScriptedPolicy(honest), grader=grader)
        cheated = await run_episode(task, ScriptedPolicy(cheat), grader=grader)
    assert solved.status == Status.OK, solved.error
    assert solved.steps[0].observation.strip() == "/app"
    assert solved.reward is not None and solved.reward.reward == 1.0
    assert cheated.reward is not None and cheated.reward.reward == 0.0
