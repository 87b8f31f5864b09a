"""Pieces the red teams' attacks share (spliced into their sources), and the task directories
of their own that later rounds wrote, in the layout of examples/tasks/median."""

from pathlib import Path

from tempering.tasks import Task, load_task

# What the red teams' oracles share: the mutant canary told from the hidden test it is made from
# by its file name beside that file's (``test_x_word.py`` beside ``test_x.py``), a declared gap
# (docs/rewards.md), so that an attack which reads the expected values fails the canary on
# purpose. Spliced into the attacks' sources (which import ``os``).
CANARY_BY_NAME = '''def _canary(filename):
    folder, base = os.path.split(filename)
    stem = base[:-3]
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return any(n.endswith(".py") and n[:-3] != stem and stem.startswith(n[:-3] + "_")
               for n in names)
'''


def write_task(root: Path, name: str, spec: dict[str, str], runner: str,
               isolation: str = "shared") -> Task:
    """A task directory at ``root`` from ``spec`` (its module's name, the test file's name
    and text, the solution and the stub), graded by ``runner`` with ``isolation``; loaded."""
    for part in ("workspace", "tests", "solution"):
        (root / part).mkdir(parents=True)
    (root / "task.toml").write_text(
        f'[task]\nid = "{name}"\ndescription = "the red team\'s {name}"\n\n'
        f'[grading]\ncommand = "python3 -m pytest tests"\nrunner = "{runner}"\ntimeout_s = 60\n'
        f'isolation = "{isolation}"\n')
    (root / "instruction.md").write_text(f"Implement {spec['module']}.\n")
    (root / "workspace" / f"{spec['module']}.py").write_text(spec["stub"])
    (root / "solution" / f"{spec['module']}.py").write_text(spec["solution"])
    (root / "tests" / spec["test_name"]).write_text(spec["tests"])
    return load_task(root)
