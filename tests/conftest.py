"""Test-wide setup: the whole run sits under a cgroup guard.

The security suite attacks real sandboxes with fork bombs, memory bombs and floods. They are
safe only if the sandbox limits hold, so the test process first moves itself into a cgroup with
a process and memory ceiling (sandboxes nest below it): a failed containment then fails a test
instead of taking the machine down.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backends import GRADING_ROOTFS, unavailable
from tempering.sandbox.cgroup import enter_guard

GUARD_PIDS = int(os.environ.get("TEMPERING_TEST_PIDS", "6000"))
GUARD_MEMORY_MB = int(os.environ.get("TEMPERING_TEST_MEMORY_MB", "12288"))


def pytest_configure(config) -> None:  # type: ignore[no-untyped-def]
    guard = enter_guard(pids=GUARD_PIDS, memory_mb=GUARD_MEMORY_MB)
    config._tempering_guard = guard  # noqa: SLF001 - shown in the header below
    if GRADING_ROOTFS:
        _grade_on(GRADING_ROOTFS)


def _grade_on(rootfs: str) -> None:
    from tempering.reward import grader

    original = grader.grading_spec

    def grading_spec(task):  # type: ignore[no-untyped-def]
        spec = original(task)
        if spec.backend != "local" or spec.rootfs is not None:
            return spec
        return spec.model_copy(update={"rootfs": rootfs})

    grader.grading_spec = grading_spec


def pytest_report_header(config) -> str:  # type: ignore[no-untyped-def]
    guard = getattr(config, "_tempering_guard", None)
    line = (f"tempering guard: pids<={GUARD_PIDS}, memory<={GUARD_MEMORY_MB} MiB ({guard})"
            if guard else "tempering guard: none (not root or no cgroups)")
    return line + (f"\ngradings run on {GRADING_ROOTFS}" if GRADING_ROOTFS else "")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 model and ChatML tokenizer (``policy.tiny``), built locally in ~2 s."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tempering.policy.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen2")


@pytest.fixture
async def engine(tiny_model_dir: Path) -> AsyncIterator[Any]:
    """A ``LocalEngine`` on the tiny model, closed afterwards."""
    from tempering.policy.local import LocalEngine

    async with LocalEngine(tiny_model_dir) as eng:
        yield eng


@pytest.fixture
def docker_ready() -> None:
    """Skip, with the reason, where the docker backend cannot run."""
    why = unavailable("docker")
    if why:
        pytest.skip(f"docker backend unavailable: {why}")
