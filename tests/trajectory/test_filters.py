"""Filters on hand-built batches whose right answer is known, and the report's arithmetic."""

from __future__ import annotations

import pytest

from tempering.errors import ConfigError
from tempering.reward.result import RewardResult
from tempering.trajectory.filters import (
    Dedup,
    DropInfra,
    DropTampered,
    DropZeroVariance,
    FilterOptions,
    FilterReport,
    LengthLimit,
    MarkRecovered,
    Pipeline,
    build_pipeline,
    default_pipeline,
    token_count,
)
from tempering.trajectory.schema import Status, Step, Trajectory


def grade(value: float, flags: list[str] | None = None) -> RewardResult:
    return RewardResult(reward=value, components={"tests": value}, tests_passed=0,
                        tests_total=1, flags=flags or [])


def traj(task: str = "t", *, status: Status = Status.OK, reward: float | None = 1.0,
         group: str = "", steps: list[Step] | None = None, flags: list[str] | None = None,
         marks: list[str] | None = None) -> Trajectory:
    return Trajectory(task_id=task, status=status, group_id=group,
                      reward=None if reward is None else grade(reward, flags),
                      steps=steps if steps is not None else [bash(0, "ls")],
                      marks=marks or [])


def bash(i: int, command: str, **kw: object) -> Step:
    return Step(index=i, action="bash", tool_call_id=f"call_{i}",
                arguments=f'{{"command": "{command}"}}', **kw)  # type: ignore[arg-type]


def submit(i: int) -> Step:
    return Step(index=i, action="submit", tool_call_id=f"call_{i}", arguments="{}")


def check_sums(report: FilterReport) -> None:
    """The report's numbers add up: each filter sees what the last kept, seen = kept + dropped,
    reasons sum to dropped, marks to marked."""
    seen = report.seen
    for stats in report.filters:
        assert stats.seen == seen
        assert stats.seen == stats.kept + stats.dropped
        assert sum(stats.reasons.values()) == stats.dropped
        assert sum(stats.marks.values()) == stats.marked
        seen = stats.kept
    assert report.kept == seen
    assert report.dropped == report.seen - report.kept


def test_drop_infra_keeps_model_failures() -> None:
    batch = [traj(status=s, reward=None if s.infra else 0.0) for s in Status]
    kept, report = Pipeline([DropInfra()]).run(batch)
    assert {t.status for t in kept} == {Status.OK, Status.MODEL_ERROR, Status.MODEL_TIMEOUT,
                                        Status.TAMPERED}
    assert report.filters[0].reasons == {"env_timeout": 1, "infra_error": 1}
    assert [t.trajectory_id for t in kept] == [t.trajectory_id for t in batch
                                               if not t.status.infra]  # order kept
    check_sums(report)


def test_drop_tampered_by_status_and_by_flag() -> None:
    clean = traj(reward=1.0, flags=["timeout"])  # a note, not tampering
    by_status = traj(status=Status.TAMPERED, reward=0.0)
    by_flag = traj(reward=0.0, flags=["conftest", "timeout"])
    kept, report = Pipeline([DropTampered()]).run([clean, by_status, by_flag])
    assert kept == [clean]
    assert report.filters[0].reasons == {"flag:conftest": 1, "tampered": 1}
    check_sums(report)


def test_zero_variance_drops_flat_groups_keeps_informative_and_ungrouped() -> None:
    flat = [traj(group="a", reward=0.5) for _ in range(3)]
    nearly_flat = [traj(group="b", reward=0.5), traj(group="b", reward=0.5 + 1e-9)]
    mixed = [traj(group="c", reward=0.0), traj(group="c", reward=1.0)]
    alone = traj(group="", reward=1.0)
    # ungraded members do not count: one graded member left is no variance
    half_graded = [traj(group="d", reward=1.0), traj(group="d", reward=None)]
    batch = [*flat, *nearly_flat, *mixed, alone, *half_graded]
    kept, report = Pipeline([DropZeroVariance()]).run(batch)
    assert kept == [*mixed, alone]
    assert report.filters[0].reasons == {"zero_variance": 7}
    check_sums(report)

    kept, report = Pipeline([DropZeroVariance(keep_ungrouped=False)]).run(batch)
    assert kept == mixed
    assert report.filters[0].reasons == {"ungrouped": 1, "zero_variance": 7}
    # eps widens what counts as equal
    kept, _ = Pipeline([DropZeroVariance(eps=2.0)]).run(mixed)
    assert kept == []


def test_mark_recovered_marks_without_dropping() -> None:
    error_step = [bash(0, "pytest", exit_code=1), bash(1, "fix"), submit(2)]
    recovered = traj(steps=error_step, reward=1.0)
    timed_out = traj(steps=[bash(0, "sleep", timed_out=True), submit(1)], reward=1.0)
    tool_error = traj(steps=[Step(index=0, action="invalid", text="<tool_call>{",
                                  error="not JSON"), submit(1)], reward=1.0)
    failed_after_error = traj(steps=error_step, reward=0.0)
    clean_success = traj(steps=[bash(0, "ls", exit_code=0), submit(1)], reward=1.0)
    error_last = traj(steps=[bash(0, "ls"), bash(1, "false", exit_code=1)], reward=1.0)
    batch = [recovered, timed_out, tool_error, failed_after_error, clean_success, error_last]

    kept, report = Pipeline([MarkRecovered()]).run(batch)
    assert len(kept) == len(batch)  # never drops by default
    assert [("recovered" in t.marks) for t in kept] == [True, True, True, False, False, False]
    assert recovered.marks == []  # the input is frozen: marks go on a copy
    assert report.filters[0].marks == {"recovered": 3}
    check_sums(report)

    kept, report = Pipeline([MarkRecovered(keep_only=True)]).run(batch)
    assert [t.trajectory_id for t in kept] == [recovered.trajectory_id,
                                               timed_out.trajectory_id, tool_error.trajectory_id]
    assert report.filters[0].reasons == {"not_recovered": 3}
    check_sums(report)

    # marking twice does not repeat the mark
    again, _ = Pipeline([MarkRecovered(), MarkRecovered()]).run([recovered])
    assert again[0].marks == ["recovered"]


def test_mark_recovered_threshold_and_task_best() -> None:
    steps = [bash(0, "pytest", exit_code=1), submit(1)]
    partial = traj("x", steps=steps, reward=0.8)
    worse = traj("x", steps=[submit(0)], reward=0.4)
    assert "recovered" not in Pipeline([MarkRecovered()]).apply([partial])[0].marks
    assert "recovered" in Pipeline([MarkRecovered(threshold=0.75)]).apply([partial])[0].marks
    # None: the task's best in the batch is the bar (0.8 here)
    kept = Pipeline([MarkRecovered(threshold=None)]).apply([partial, worse])
    assert [("recovered" in t.marks) for t in kept] == [True, False]
    with pytest.raises(ConfigError, match="threshold=1.5"):
        MarkRecovered(threshold=1.5)


def test_dedup_keeps_the_first_of_same_actions_and_outcome() -> None:
    first = traj(steps=[bash(0, "ls"), submit(1)], reward=1.0)
    same = traj(steps=[Step(index=0, action="bash", arguments='{ "command":"ls" }'),
                       submit(1)], reward=1.0)  # same call, other spacing and ids
    other_outcome = traj(steps=[bash(0, "ls"), submit(1)], reward=0.0)
    other_task = traj("u", steps=[bash(0, "ls"), submit(1)], reward=1.0)
    other_actions = traj(steps=[bash(0, "pwd"), submit(1)], reward=1.0)
    batch = [first, same, other_outcome, other_task, other_actions, same]
    kept, report = Pipeline([Dedup()]).run(batch)
    assert kept == [first, other_outcome, other_task, other_actions]
    assert report.filters[0].reasons == {"duplicate": 2}
    check_sums(report)


def test_length_limit_steps_and_tokens() -> None:
    def tokens(n: int) -> list[Step]:
        return [Step(index=0, action="bash", prompt_token_ids=list(range(n)),
                     completion_token_ids=[1, 2])]

    short = traj(steps=[submit(0)])
    long = traj(steps=[bash(i, "ls") for i in range(5)])
    heavy = traj(steps=tokens(100))
    light = traj(steps=tokens(8))
    assert token_count(heavy) == 102
    kept, report = Pipeline([LengthLimit(min_steps=1, max_steps=4, max_tokens=50)]).run(
        [short, long, heavy, light])
    assert kept == [short, light]
    assert report.filters[0].reasons == {"too_many_steps": 1, "too_many_tokens": 1}
    kept, report = Pipeline([LengthLimit(min_steps=2)]).run([short, long])
    assert kept == [long] and report.filters[0].reasons == {"too_few_steps": 1}
    with pytest.raises(ConfigError, match="min_steps=3 is above max_steps=2"):
        LengthLimit(min_steps=3, max_steps=2)
    with pytest.raises(ConfigError, match="max_tokens=-1"):
        LengthLimit(max_tokens=-1)


def test_default_pipeline_order_and_counts() -> None:
    error_fixed = [bash(0, "pytest", exit_code=1), bash(1, "fix"), submit(2)]
    batch = [
        traj(group="g1", status=Status.INFRA_ERROR, reward=None),   # infra
        traj(group="g1", steps=error_fixed, reward=1.0),             # recovered
        traj(group="g1", reward=0.0, steps=[bash(0, "x"), submit(1)]),
        traj(group="g1", reward=0.0, steps=[bash(0, "x"), submit(1)]),  # duplicate
        traj(group="g2", status=Status.TAMPERED, reward=0.0),         # tampered
        traj(group="g2", reward=0.0, steps=[bash(0, "y")]),
        traj(group="g2", reward=0.0, steps=[bash(0, "z")]),           # g2 flat after tamper drop
        traj(group="g3", status=Status.MODEL_ERROR, reward=0.0),      # model failure: stays
        traj(group="g3", reward=1.0),
    ]
    pipeline = default_pipeline()
    assert [f.name for f in pipeline.filters] == ["drop_infra", "drop_tampered", "dedup",
                                                  "zero_variance", "mark_recovered"]
    kept, report = pipeline.run(batch)
    check_sums(report)
    assert [s.dropped for s in report.filters] == [1, 1, 1, 2, 0]
    assert report.filters[-1].marked == 1
    assert report.seen == 9 and report.kept == 4
    assert [t.group_id for t in kept] == ["g1", "g1", "g3", "g3"]
    assert kept[0].marks == ["recovered"]
    assert any(t.status is Status.MODEL_ERROR for t in kept)
    # The report survives a round trip through JSON (it is written next to filtered stores).
    assert FilterReport.model_validate_json(report.model_dump_json()) == report


def test_order_matters_tampering_before_zero_variance() -> None:
    # Dropping the tampered member first leaves group g flat; the other order keeps it.
    batch = [traj(group="g", status=Status.TAMPERED, reward=0.0, steps=[bash(0, "a")]),
             traj(group="g", reward=1.0, steps=[bash(0, "b")])]
    assert Pipeline([DropTampered(), DropZeroVariance()]).apply(batch) == []
    assert len(Pipeline([DropZeroVariance(), DropTampered()]).apply(batch)) == 1


def test_build_pipeline_from_options_and_plain_filters() -> None:
    pipeline = build_pipeline(FilterOptions(keep_infra=True, keep_duplicates=True, max_steps=3,
                                            only_recovered=True))
    assert [f.name for f in pipeline.filters] == ["drop_tampered", "length_limit",
                                                  "zero_variance", "mark_recovered"]
    with pytest.raises(ValueError, match="extra"):
        FilterOptions(nope=True)  # type: ignore[call-arg]

    class EvenOnly:  # a user's own filter: just a name and apply()
        name = "even_only"

        def apply(self, trajs: list[Trajectory]) -> list[Trajectory]:
            return [t.model_copy(update={"marks": ["even"]}) for t in trajs[::2]]

    kept, report = Pipeline([EvenOnly(), Pipeline([DropInfra()])]).run(
        [traj(), traj(), traj(status=Status.ENV_TIMEOUT, reward=None)])
    assert len(kept) == 1
    assert report.filters[0].model_dump(include={"dropped", "marked", "reasons", "marks"}) == {
        "dropped": 1, "marked": 2, "reasons": {"dropped": 1}, "marks": {"even": 2}}
    assert report.filters[1].name == "pipeline" and report.filters[1].dropped == 1
    check_sums(report)
    with pytest.raises(ConfigError, match="not a filter"):
        Pipeline([object()])  # type: ignore[list-item]
