"""``grading.capture``: a task's grade depends on directories of its environment beyond the
workdir. The agent's tree there (links as links) is laid into a fresh grading sandbox of the
same image; nothing else it changed gets there; a capture that would let the agent replace the
verifier's interpreter or tools is refused when the task loads, with the path named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attempts import attempt
from tempering.errors import ConfigError
from tempering.reward import Grader
from tempering.reward.grader import changes
from tempering.reward.validate import validate_task
from tempering.tasks import load_task
from tempering.tasks.capture import confine_links
from tempering.tasks.files import FileTree
from tempering.tasks.setup import prepared

HARBOR_TOML = """version = "1.0"

[metadata]
category = "web"

[verifier]
timeout_sec = 60.0

[environment]
cpus = 1
memory_mb = 512
storage_mb = 256

[tempering]
capture = {capture}
"""

# A page to publish outside the workdir; /app (the workdir) is not captured, so nothing the
# agent leaves there reaches the verifier.
SITE = {
    "instruction.md": "Publish /srv/site/index.html saying hello, with home.html a link to it.\n",
    "environment/Dockerfile": "FROM tempering/python:latest\nWORKDIR /app\nCOPY notes.txt /app/\n",
    "environment/notes.txt": "notes\n",
    "tests/expected.html": "hello\n",
    "tests/test.sh": """#!/bin/bash
if cmp -s /srv/site/index.html /tests/expected.html && [ ! -e /app/extra ] \\
   && [ "$(readlink /srv/site/home.html)" = index.html ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
""",
    "solution/solve.sh": """#!/bin/bash
echo hello > /srv/site/index.html
ln -s index.html /srv/site/home.html
echo x > /app/extra
""",
}

# A service's configuration in /etc to repair, built into the image: the fix must change a
# file, keep the image's link and delete a stale file.
CONF = {
    "instruction.md": "The app reads /etc/myapp/app.conf: make it port 8080, drop stale.\n",
    "environment/Dockerfile": (
        "FROM tempering/python:latest\nWORKDIR /app\nUSER root\n"
        "RUN mkdir -p /etc/myapp && printf 'port=0\\n' > /etc/myapp/app.conf "
        "&& ln -s app.conf /etc/myapp/current.conf && echo old > /etc/myapp/stale\n"),
    "tests/test.sh": """#!/bin/bash
if grep -qx port=8080 /etc/myapp/current.conf && [ ! -e /etc/myapp/stale ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
""",
    "solution/solve.sh": "#!/bin/bash\nsed -i s/port=0/port=8080/ /etc/myapp/app.conf\n"
                         "rm /etc/myapp/stale\n",
}


def harbor_task(root: Path, files: dict[str, str], capture: list[str], extra: str = "") -> Path:
    toml = HARBOR_TOML.format(capture="[" + ", ".join(f'"{c}"' for c in capture) + "]") + extra
    for path, text in {"task.toml": toml, **files}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def our_task(root: Path, capture: list[str], *, env: str = "",
             tests: str = "def test_x():\n    pass\n") -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "workspace").mkdir()
    (root / "instruction.md").write_text("Do it.\n")
    (root / "tests" / "test_out.py").write_text(tests)
    capture_list = "[" + ", ".join(f'"{c}"' for c in capture) + "]"
    (root / "task.toml").write_text(f'[task]\nid = "cap"\n\n[sandbox]\nbackend = "local"\n'
                                    f'{env}\n[grading]\ncapture = {capture_list}\n')
    return root


@pytest.mark.parametrize(("capture", "named"), [
    (["/usr/local/bin"], "/usr"),
    (["/usr"], "/usr"),
    (["/lib/x"], "/lib"),
    (["/etc"], "/etc"),
    (["/etc/alternatives"], "/etc/alternatives"),
    (["/etc/python3.12"], "/etc/python"),
    (["/"], "/"),
    (["/tests"], "/tests"),
    (["/logs/verifier"], "/logs"),
    (["/tmp/x"], "/tmp"),
    (["/workspace/src"], "nest"),
    (["srv/x"], "normalised absolute"),
    (["/srv/a/../b"], "normalised absolute"),
    (["/srv/x", "/srv/x"], "twice"),
])
def test_a_capture_of_the_verifiers_tools_is_refused_naming_the_path(
        tmp_path: Path, capture: list[str], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_task(our_task(tmp_path / "t", capture))
    assert f"{capture[0]!r}" in str(info.value) and named in str(info.value), info.value


def test_a_capture_on_a_search_path_is_refused(tmp_path: Path) -> None:
    """A directory the verifier's programs load code from is the verifier's, whatever its
    name: on PATH, PYTHONPATH, LD_LIBRARY_PATH of the sandbox's environment."""
    for var in ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH"):
        root = our_task(tmp_path / var, ["/opt/app"],
                        env=f'env = {{ {var} = "/usr/bin:/opt/app/lib" }}\n')
        with pytest.raises(ConfigError, match=f"{var} names /opt/app/lib"):
            load_task(root)


def test_the_image_is_asked_once_per_path_for_a_family_of_tasks(tmp_path: Path,
                                                                  monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A task set of thousands sharing an image and its captured directories starts one
    sandbox to check them, not one per task: each path is asked of the image once per
    process; a new path (a program another task's tests name) is asked alone."""
    from tempering.tasks import capture

    asked: list[list[str]] = []
    real = capture._exec  # noqa: SLF001 - counted, then run as it is

    async def counted(spec, argv):  # type: ignore[no-untyped-def]
        asked.append(argv[4:])
        return await real(spec, argv)

    monkeypatch.setattr(capture, "_exec", counted)
    monkeypatch.setattr(capture, "_facts", {})
    for i in range(3):
        load_task(our_task(tmp_path / f"t{i}", ["/srv/fam"], tests=f"def test_{i}():\n    pass\n"))
    assert len(asked) == 1 and asked[0][0] == "uses" and "/srv/fam" in asked[0]
    load_task(our_task(tmp_path / "named", ["/srv/fam"],
                       tests="import subprocess\n\n\ndef test_x():\n"
                             "    subprocess.run(['/srv/fam/check'])\n"))
    assert len(asked) == 2 and asked[1] == ["-", "--search", "--tokens", "/srv/fam/check"]


def test_links_that_lead_out_of_a_captured_directory_are_left_out() -> None:
    """In the grading sandbox a link resolves there, where /tests holds the hidden tests: a
    link the agent made is kept only when it cannot leave its directory, whatever its
    components (relative without '..', or absolute below it); the image's own links stay."""
    pristine = FileTree(links={"img": "/usr/share/doc"})
    final = FileTree({"a.html": b"a"}, links={
        "img": "/usr/share/doc", "home.html": "a.html", "deep": "sub/x", "abs": "/srv/site/a",
        "tests": "/tests/expected.html", "up": "../site/a.html", "dots": "sub/../../x",
        "proc": "/proc/self/root/tests/e", "other": "/usr/share/doc", "empty": ""})
    kept, left = confine_links("/srv/site", pristine, final)
    assert sorted(kept.links) == ["abs", "deep", "home.html", "img"]
    assert sorted(entry.split(" ")[0] for entry in left) == [
        f"/srv/site/{n}" for n in ("dots", "empty", "other", "proc", "tests", "up")]
    assert changes(pristine, kept) == ["a.html", "abs", "deep", "home.html"]
    assert changes(kept, kept.overlay({"a.html": None})) == ["a.html"]


async def test_a_captured_directory_is_graded_in_a_fresh_sandbox(tmp_path: Path) -> None:
    """The local backend: /srv/site is the agent's to write (empty in the image), the
    solution's page and link reach the verifier, its file in the uncaptured workdir does not;
    untouched scores 0."""
    task = load_task(harbor_task(tmp_path / "site", SITE, ["/srv/site"]), backend="local")
    assert task.sandbox.writable_dirs == ("/srv/site",) and not task.captures_workdir
    async with Grader() as grader:
        validation = await validate_task(task, grader)
    assert validation.ok, validation.problems
    assert validation.solution is not None and validation.untouched is not None
    assert validation.solution.changed_files == ["/srv/site/home.html", "/srv/site/index.html"]
    assert validation.untouched.reward == 0.0


async def test_what_the_agent_leaves_elsewhere_or_links_to_never_counts(tmp_path: Path) -> None:
    """The page in /tmp or in the workdir, a link to the hidden expected page, a link whose
    components climb out: all 0; the link is listed as left out."""
    task = load_task(harbor_task(tmp_path / "site", SITE, ["/srv/site"]), backend="local")
    attempts = {
        "tmp": "echo hello > /tmp/index.html; ln -s index.html /srv/site/home.html",
        "workdir": "echo hello > /app/index.html; ln -s index.html /srv/site/home.html",
        "link-to-tests": "ln -s /tests/expected.html /srv/site/index.html; "
                         "ln -s index.html /srv/site/home.html",
        "link-climbs": "ln -s ../../tests/expected.html /srv/site/index.html; "
                       "ln -s index.html /srv/site/home.html",
    }
    async with Grader() as grader:
        for name, script in attempts.items():
            result = await attempt(task, shell=script, grader=grader)
            assert result.reward == 0.0, (name, result.log)
            if name.startswith("link"):
                assert any("capture_left_out: /srv/site/index.html" in d
                           for d in result.details), (name, result.details)


async def test_pytest_tests_see_the_captured_directory(tmp_path: Path) -> None:
    """Not only scripts: hidden pytest tests read the captured directory as the agent left it,
    beside the workspace."""
    tests = ("import json\n\ndef test_result():\n"
             "    assert json.load(open('/srv/out/result.json')) == {'ok': True}\n")
    root = our_task(tmp_path / "t", ["/workspace", "/srv/out"], tests=tests)
    (root / "task.toml").write_text((root / "task.toml").read_text() +
                                    "expected_tests = 1\n")
    task = load_task(root)
    async with Grader() as grader:
        done = await grader.grade_files(task, task.workspace, captured={
            "/srv/out": FileTree.of({"result.json": '{"ok": true}'})})
        undone = await grader.grade_files(task, task.workspace)
    assert done.reward == 1.0, done.log
    assert undone.reward == 0.0


async def test_an_episode_plays_a_task_with_a_captured_directory(tmp_path: Path) -> None:
    from tempering.agent import run_episode
    from tempering.policy.scripted import ScriptedPolicy

    task = load_task(harbor_task(tmp_path / "site", SITE, ["/srv/site"]), backend="local")
    actions = [("bash", {"command": "echo hello > /srv/site/index.html && "
                                    "ln -s index.html /srv/site/home.html"}), ("submit", {})]
    async with Grader() as grader:
        episode = await run_episode(task, ScriptedPolicy(actions), grader=grader)
    assert episode.reward is not None and episode.reward.reward == 1.0, episode.error


@pytest.mark.docker
@pytest.mark.slow  # CI's slow half: image builds and containers
async def test_a_captured_directory_of_the_image_on_the_docker_backend(
        tmp_path: Path, docker_ready: None) -> None:
    """The image's /etc/myapp starts as built (a file, a link, a stale file); the repair's
    change set (a modified file, a deleted one, the link kept) reaches the fresh sandbox."""
    task = load_task(harbor_task(tmp_path / "conf", CONF, ["/etc/myapp"]))
    pristine = task.environment["/etc/myapp"]
    assert pristine["app.conf"] == b"port=0\n" and pristine.links == {"current.conf": "app.conf"}
    async with Grader() as grader:
        validation = await validate_task(task, grader)
    assert validation.ok, validation.problems
    assert validation.solution is not None
    assert validation.solution.changed_files == ["/etc/myapp/app.conf", "/etc/myapp/stale"]


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize(("capture", "error"), [
    (["/opt/tool"], "/usr/bin/tool is /opt/tool/run"),
    (["/srv/web/x"], "lies behind a link in the image"),
    (["/etc/myapp/app.conf"], "is not a directory in the image"),
])
async def test_the_image_is_asked_what_a_capture_would_reach(
        tmp_path: Path, docker_ready: None, capture: list[str], error: str) -> None:
    build = ("RUN mkdir -p /opt/tool /srv /usr/share/site && printf '#!/bin/sh\\n' > "
             "/opt/tool/run && ln -s /opt/tool/run /usr/bin/tool && "
             "ln -s /usr/share/site /srv/web\n")
    files = {**CONF, "environment/Dockerfile": CONF["environment/Dockerfile"] + build}
    with pytest.raises(ConfigError, match=error):
        load_task(harbor_task(tmp_path / "t", files, capture))


# Red team, round forty-six: each of these was accepted at load and scored 1.0 without the task
# done (a venv's activate sourced by the verifier's shell rewritten, its python replaced; a
# library the loader reaches through a link into the capture replaced; a program on an aliased
# PATH replaced), or made the grader raise (a captured tree larger than its grading mount).
RUN_TEST = "#!/bin/bash\nif {check}; then echo 1 > /logs/verifier/reward.txt; else " \
    "echo 0 > /logs/verifier/reward.txt; fi\n"


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize(("build", "capture", "test", "extra", "error"), [
    ("RUN python3 -m venv --without-pip /opt/venv\n", "/opt/venv",
     "source /opt/venv/bin/activate\n" + RUN_TEST.format(check="python /tests/check.py"), "",
     "the hidden tests source /opt/venv/bin/activate"),
    ("RUN python3 -m venv --without-pip /opt/venv\n", "/opt/venv",
     RUN_TEST.format(check="python3 /tests/check.py"), "", "an interpreter's environment"),
    ("RUN mkdir -p /opt/zlib && cp /lib/x86_64-linux-gnu/libz.so.1.* /opt/zlib/libz.so.1.x && "
     "ln -sf /opt/zlib/libz.so.1.x /lib/x86_64-linux-gnu/libz.so.1\n", "/opt/zlib",
     RUN_TEST.format(check="python3 /tests/check.py"), "", "is /opt/zlib/libz.so.1.x"),
    ("RUN mkdir -p /opt /srv/tools/bin && ln -s /srv/tools /opt/tools && printf '#!/bin/sh\\n' > "
     "/srv/tools/bin/checker && chmod +x /srv/tools/bin/checker\n", "/srv/tools",
     RUN_TEST.format(check="checker"), '\n[verifier.env]\nPATH = "/opt/tools/bin:/usr/bin:/bin"\n',
     "/opt/tools/bin is /srv/tools/bin"),
    ("RUN mkdir -p /srv/tool && printf '#!/bin/sh\\n' > /srv/tool/check && chmod +x "
     "/srv/tool/check\n", "/srv/tool", RUN_TEST.format(check="/srv/tool/check"), "",
     "the hidden tests run /srv/tool/check"),
], ids=["venv-sourced", "venv", "library-link", "aliased-path", "program-named"])
async def test_a_capture_of_what_the_verifier_runs_is_refused(
        tmp_path: Path, docker_ready: None, build: str, capture: str, test: str, extra: str,
        error: str) -> None:
    files = {**CONF, "environment/Dockerfile": CONF["environment/Dockerfile"] + build,
             "tests/test.sh": test, "tests/check.py": "print('ok')\n"}
    with pytest.raises(ConfigError, match=re.escape(error)):
        load_task(harbor_task(tmp_path / "t", files, [capture], extra))


@pytest.mark.docker
@pytest.mark.slow
async def test_a_captured_tree_larger_than_its_grading_mount_is_an_honest_0(
        tmp_path: Path, docker_ready: None) -> None:
    """The agent's sandbox (volume storage) lets a captured directory take most of the disk;
    the grading sandbox's mount is smaller. The tree is read within what fits there, the rest
    listed as left out: an honest 0, never an exception (round forty-six)."""
    task = load_task(harbor_task(tmp_path / "conf", CONF, ["/etc/myapp"]))
    async with Grader() as grader:
        for fill in ("for i in 1 2 3 4 5; do head -c 12000000 /dev/urandom > /etc/myapp/b$i; "
                     "done", "mkdir /etc/myapp/d && cd /etc/myapp/d && seq 1 8000 | xargs touch"):
            result = await attempt(task, shell=fill, grader=grader, timeout=120)
            assert result.reward == 0.0
            assert any(d.startswith("capture_left_out: /etc/myapp/") for d in result.details)


@pytest.mark.docker
@pytest.mark.slow
async def test_permission_bits_of_a_captured_directory_are_kept(
        tmp_path: Path, docker_ready: None) -> None:
    """A task that checks a mode (a key made private) grades the agent's chmod: the bits are
    carried as they are, the image's too (round forty-six: they were flattened to 644)."""
    files = {**CONF, "environment/Dockerfile": CONF["environment/Dockerfile"].replace(
                 "echo old > /etc/myapp/stale", "echo k > /etc/myapp/key && chmod 640 "
                 "/etc/myapp/key"),
             "tests/test.sh": RUN_TEST.format(check='[ "$(stat -c %a /etc/myapp/key)" = 600 ]'),
             "solution/solve.sh": "#!/bin/bash\nchmod 600 /etc/myapp/key\n"}
    task = load_task(harbor_task(tmp_path / "modes", files, ["/etc/myapp"]))
    assert task.environment["/etc/myapp"].mode("key") == 0o640
    async with Grader() as grader:
        validation = await validate_task(task, grader)
    assert validation.ok, validation.problems
    assert validation.solution is not None
    assert validation.solution.changed_files == ["/etc/myapp/key"]


# Red team, round forty-seven: the verifier's Python started inside a captured directory
# imported the agent's modules (a json.py, a pytest.py), and a venv a setup step made in a
# captured directory was never asked about. Both scored 1.0 without the task done.
APP = {
    "instruction.md": "Write /srv/app/conf.json with port 8080.\n",
    "environment/Dockerfile": "FROM tempering/python:latest\nWORKDIR /app\nCOPY notes.txt /app/\n",
    "environment/notes.txt": "notes\n",
    "tests/test.sh": "#!/bin/bash\ncd /srv/app\n" + RUN_TEST.format(
        check="[ \"$(python3 -c 'import json; print(json.load(open(\"conf.json\"))[\"port\"])')\""
              " = 8080 ]").removeprefix("#!/bin/bash\n"),
    "solution/solve.sh": "#!/bin/bash\necho '{\"port\": 8080}' > /srv/app/conf.json\n",
}
FAKE_JSON = "def load(f):\n    return {'port': 8080}\n"


async def test_modules_of_a_captured_directory_that_shadow_the_verifiers_are_dropped(
        tmp_path: Path) -> None:
    task = load_task(harbor_task(tmp_path / "app", APP, ["/srv/app"]), backend="local")
    async with Grader() as grader:
        validation = await validate_task(task, grader)
        assert validation.ok, validation.problems
        for name in ("json.py", "pytest.py", "sitecustomize.py", "conftest.py"):
            shell = (f"printf '%s' \"{FAKE_JSON}\" > /srv/app/{name}; "
                     "echo '{\"port\": 0}' > /srv/app/conf.json")
            result = await attempt(task, shell=shell, grader=grader)
            assert result.reward == 0.0 and result.tampered, (name, result.flags)


async def test_a_venv_a_setup_step_makes_in_a_captured_directory_is_refused(
        tmp_path: Path) -> None:
    root = our_task(tmp_path / "t", ["/workspace", "/srv/env"])
    (root / "task.toml").write_text((root / "task.toml").read_text().replace(
        "[grading]", "[setup]\ncommand = 'mkdir -p /srv/env/bin && touch /srv/env/pyvenv.cfg "
        "/srv/env/bin/activate'\n\n[grading]"))
    task = load_task(root)
    with pytest.raises(ConfigError, match="interpreter's environment"):
        await prepared(task)
