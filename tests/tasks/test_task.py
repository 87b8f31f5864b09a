"""The task format: loading, validation that names every bad field, and prepare()."""

from __future__ import annotations

from pathlib import Path

import pytest

from tempering.errors import ConfigError
from tempering.sandbox import open_sandbox
from tempering.tasks import load_task

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def make_task(root: Path, toml: str = '[task]\nid = "t"\n', *, tests: bool = True,
              instruction: bool = True) -> Path:
    (root / "workspace").mkdir(parents=True)
    (root / "workspace" / "code.py").write_text("def f():\n    return 0\n")
    if tests:
        (root / "tests").mkdir()
        (root / "tests" / "test_code.py").write_text("from code import f\n\n\ndef test_f():\n"
                                                     "    assert f() == 1\n")
    if instruction:
        (root / "instruction.md").write_text("Make f return 1.\n")
    (root / "task.toml").write_text(toml)
    return root


def test_the_smallest_task_loads_with_defaults(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path))
    assert task.id == "t" and task.family == "t"
    assert task.config.grading.command == "python3 -m pytest tests"
    assert task.config.reward == {"tests": 1.0}
    assert set(task.workspace) == {"code.py"} and set(task.tests) == {"test_code.py"}
    assert task.solution is None
    assert task.sandbox.memory_mb == 1024


def test_examples_load() -> None:
    median = load_task(EXAMPLES / "median")
    slugify = load_task(EXAMPLES / "slugify")
    assert median.solution is not None and "stats.py" in median.solution
    assert slugify.config.verifiers[0].component_names == ["cms"]
    assert slugify.config.grading.protected == ["cms_rules.json"]


@pytest.mark.parametrize(("toml", "mentions"), [
    ('[task]\nid = "t"\n[grading]\ntimeout_s = -1\n', ["grading.timeout_s", "-1"]),
    ('[task]\nid = "t"\nbogus = 1\n', ["task.bogus"]),
    ('[task]\nid = "bad id!"\n', ["task.id", "bad id!"]),
    ('[task]\nid = "t"\n[sandbox]\nmemory_mb = -5\n', ["sandbox.memory_mb", "-5"]),
    ('[task]\nid = "t"\n[sandbox]\nbackend = "nope"\n', ["sandbox.backend", "nope"]),
    ('[task]\nid = "t"\n[grading]\ncommand = "make test"\n', ["grading.command", "make test",
                                                             "pytest"]),
    ('[task]\nid = "t"\n[reward]\nspeed = 1.0\n', ["speed", "unknown component"]),
    ('[task]\nid = "t"\n[reward]\ntests = 0.0\n', ["all 0"]),
    ('[task]\nid = "t"\n[grading]\nrunner = "plain"\ncommand = "pytest -x tests"\n',
     ["runner 'plain'", "-x"]),
    ('[task]\nid = "t"\n[[verifiers]]\nname = "v"\n', ["exactly one of command or function"]),
    ('[task]\nid = "t"\n[[verifiers]]\nname = "v"\nfunction = "v.py:f"\n', ["verifiers/v.py"]),
    ('[task\nid = "t"\n', ["not valid TOML"]),
    ('[grading]\ntimeout_s = 5\n', ["task: Field required"]),
])
def test_bad_fields_are_named(tmp_path: Path, toml: str, mentions: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_task(make_task(tmp_path, toml))
    for text in mentions:
        assert text in str(info.value), str(info.value)


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    root = make_task(tmp_path, '[task]\nid = "t"\n[grading]\ntimeout_s = 0\nscoring = "most"\n',
                     tests=False, instruction=False)
    with pytest.raises(ConfigError) as info:
        load_task(root)
    message = str(info.value)
    for text in ["grading.timeout_s", "grading.scoring", "instruction.md is missing",
                 "tests/ is missing"]:
        assert text in message, message


def test_missing_directory_and_workspace_clash(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no task.toml"):
        load_task(tmp_path / "nowhere")
    root = make_task(tmp_path)
    (root / "workspace" / "tests").mkdir()
    (root / "workspace" / "tests" / "mine.py").write_text("")
    with pytest.raises(ConfigError, match="workspace/tests/mine.py is in grading.tests_dir, "
                                          "where the hidden tests go, but tests/ has no mine.py"):
        load_task(root)
    # A repository's visible tests, each replaced by its hidden counterpart, are fine.
    (root / "tests" / "mine.py").write_text("def test_more():\n    pass\n")
    assert load_task(root).workspace["tests/mine.py"] == b""


def test_symlinks_in_a_task_are_refused(tmp_path: Path) -> None:
    root = make_task(tmp_path)
    (root / "workspace" / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(ConfigError, match="workspace/passwd .symbolic link."):
        load_task(root)


async def test_prepare_writes_the_workspace_and_never_the_tests(tmp_path: Path) -> None:
    task = load_task(EXAMPLES / "median")
    async with open_sandbox(task.sandbox) as sb:
        await task.prepare(sb)
        assert await sb.list(".") == ["stats.py"]
        assert await sb.read_file("stats.py") == task.workspace["stats.py"]
        r = await sb.exec("find / -name 'test_median.py' -not -path '/proc/*' 2>/dev/null")
        assert r.stdout == ""


def test_digest_follows_content(tmp_path: Path) -> None:
    a = load_task(make_task(tmp_path / "a"))
    b = load_task(make_task(tmp_path / "b"))
    assert a.digest == b.digest
    (tmp_path / "b" / "tests" / "test_code.py").write_text("def test_x():\n    pass\n")
    assert load_task(tmp_path / "b").digest != a.digest
