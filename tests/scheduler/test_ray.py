"""The Ray executor on a real multi-node Ray cluster started on this machine.

``ray.cluster_utils.Cluster`` runs a real head and real raylets as separate processes, so nodes
join and leave for real (``add_node`` / ``remove_node``) and a worker killed with SIGKILL is a
real process dying. One cluster serves the module: a head that offers ``inference`` and one
rollout node; tests that add nodes remove them again. Job functions live at module level so
they pickle by reference, as a user's would.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")

from ray.cluster_utils import Cluster  # noqa: E402

from tempering.errors import ConfigError, PolicyError, WorkerLostError  # noqa: E402
from tempering.policy.base import GenerateRequest, Generation, Message, Policy  # noqa: E402
from tempering.policy.config import LocalPolicyConfig, ScriptedPolicyConfig  # noqa: E402
from tempering.policy.ray import RayPolicy, start_inference  # noqa: E402
from tempering.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from tempering.scheduler.job import JobContext, JobSpec, JobStatus, Paused  # noqa: E402
from tempering.scheduler.ray import RayExecutor  # noqa: E402
from tempering.scheduler.resources import Resources  # noqa: E402
from tempering.trajectory.schema import Status  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # slow: in CI's second run

MEDIAN = Path(__file__).parents[2] / "examples" / "tasks" / "median"
SLOTS = Resources.of(sandbox=2)
# The workers import this module's jobs by name, as they would a user's installed package.
RUNTIME_ENV = {"env_vars": {"PYTHONPATH": os.pathsep.join(
    p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p)}}


# ---- jobs (module level: they travel to the workers by reference) ----------------------------

async def where(ctx: JobContext) -> tuple[str, int, str]:
    return ray.get_runtime_context().get_node_id(), os.getpid(), ctx.job_id


async def sleep_then_write(ctx: JobContext, *, started: str, path: str, seconds: float
                           ) -> tuple[str, int]:
    """Say it started (node, pid), sleep, then leave a side effect at the very end."""
    Path(started).write_text(f"{ray.get_runtime_context().get_node_id()} {os.getpid()}")
    await asyncio.sleep(seconds)
    with open(path, "a") as f:
        f.write(f"{ctx.job_id}\n")
    return ray.get_runtime_context().get_node_id(), os.getpid()


async def block_the_loop(ctx: JobContext, *, started: str) -> None:
    Path(started).write_text(str(os.getpid()))
    time.sleep(60)  # a hung job: the actor's event loop cannot answer pings


async def raise_value_error(ctx: JobContext) -> None:
    raise ValueError(f"job {ctx.job_id} has a bug")


async def raise_config_error(ctx: JobContext) -> None:
    raise ConfigError("bad value 7: use 8")


async def count_steps(ctx: JobContext, *, steps: int) -> Any:
    """A partial rollout: counts to ``steps``, pausing at a safe point between steps."""
    done: list[int] = list(ctx.resume or [])
    while len(done) < steps:
        if ctx.pause_requested:
            return Paused(done)
        done.append(ctx.attempt)
        await asyncio.sleep(0.05)
    return done


async def slow_once(ctx: JobContext, *, started: str, path: str, first_s: float,
                    retry_s: float = 0.1) -> tuple[str, int, int]:
    """Slow on its first attempt (the one a test breaks), quick on a retry; the side effect at
    the very end counts completions."""
    node = ray.get_runtime_context().get_node_id()
    Path(f"{started}.{ctx.attempt}").write_text(f"{node} {os.getpid()}")
    await asyncio.sleep(first_s if ctx.attempt == 1 else retry_s)
    with open(path, "a") as f:
        f.write(f"{ctx.job_id}\n")
    return node, os.getpid(), ctx.attempt


async def count_steps_resumable(ctx: JobContext, *, steps: int) -> Any:
    """Like count_steps; also says how many steps the last resumption started from."""
    done: list[int] = list(ctx.resume or [])
    resumed_from = len(done)
    while len(done) < steps:
        if ctx.pause_requested:
            return Paused(done)
        done.append(ctx.attempt)
        await asyncio.sleep(0.05)
    return done, resumed_from


async def median_episode(ctx: JobContext) -> Any:
    from tempering.agent.play import run_episode
    from tempering.policy.scripted import ScriptedPolicy
    from tempering.tasks import load_task

    solution = (MEDIAN / "solution" / "stats.py").read_text()
    policy = ScriptedPolicy([("write_file", {"path": "stats.py", "content": solution}),
                             ("submit", {})])
    trajectory = await run_episode(load_task(MEDIAN), policy)
    return trajectory, ray.get_runtime_context().get_node_id()


async def ask_policy(ctx: JobContext, *, policy: Policy) -> tuple[Generation, str]:
    request = GenerateRequest(messages=[Message(role="user", content="solve it")])
    return await policy.generate(request), ray.get_runtime_context().get_node_id()


# ---- the cluster and helpers -----------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "resources": {"inference": 1}})
    c.add_node(num_cpus=1, resources={"rollout": 1})
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False, runtime_env=RUNTIME_ENV)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture
def ray_up(cluster: Cluster) -> Cluster:
    if not ray.is_initialized():  # a test that let its executor own Ray shut it down
        ray.init(address=cluster.address, log_to_driver=False, runtime_env=RUNTIME_ENV)
    return cluster


@pytest.fixture
async def executors(ray_up: Cluster) -> AsyncIterator[Callable[..., Any]]:
    """Start RayExecutors (recording their capacity reports); all are closed afterwards."""
    started: list[RayExecutor] = []

    async def make(**kwargs: Any) -> tuple[RayExecutor, list[Resources]]:
        kwargs = {"slots_per_worker": SLOTS, "poll_s": 0.3, "lease_s": 10.0, **kwargs}
        executor = RayExecutor(**kwargs)
        reports: list[Resources] = []
        await executor.start(reports.append)
        started.append(executor)
        return executor, reports

    yield make
    for executor in started:
        await executor.close()


def rollout_nodes() -> set[str]:
    return {n["NodeID"] for n in ray.nodes()
            if n["Alive"] and n["Resources"].get("rollout", 0) > 0}


def head_node(cluster: Cluster) -> str:
    return str(cluster.head_node.node_id)


async def eventually(predicate: Callable[[], Any], timeout: float = 15.0,
                     what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {timeout} s")


def spec(fn: Any, demand: Resources = Resources.of(sandbox=1), **kwargs: Any) -> JobSpec:
    return JobSpec(functools.partial(fn, **kwargs) if kwargs else fn, demand=demand)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---- the executor on its own -----------------------------------------------------------------

async def test_jobs_run_on_worker_actors_of_the_nodes_with_the_resource(
        executors: Any, cluster: Cluster) -> None:
    executor, reports = await executors()
    assert reports == [SLOTS]  # one rollout node, one worker; the head offers no "rollout"
    nodes = await asyncio.gather(*(executor.run(spec(where), JobContext(f"j{i}", 1))
                                   for i in range(4)))
    assert {node for node, _, _ in nodes} == rollout_nodes() != {head_node(cluster)}
    assert {pid for _, pid, _ in nodes} == {executor.workers[0].pid} != {os.getpid()}
    assert [job_id for _, _, job_id in nodes] == ["j0", "j1", "j2", "j3"]


async def test_a_jobs_exception_arrives_as_its_own_class(executors: Any) -> None:
    executor, _ = await executors()
    with pytest.raises(ValueError, match="job j1 has a bug") as caught:
        await executor.run(spec(raise_value_error), JobContext("j1", 1))
    assert type(caught.value) is ValueError
    with pytest.raises(ConfigError, match="bad value 7") as config:
        await executor.run(spec(raise_config_error), JobContext("j2", 1))
    assert type(config.value) is ConfigError


async def test_a_node_joins_and_leaves_a_running_executor(
        executors: Any, cluster: Cluster, tmp_path: Path) -> None:
    executor, reports = await executors()
    first = set(rollout_nodes())
    busy = asyncio.ensure_future(executor.run(  # fills the first worker's two slots
        spec(sleep_then_write, Resources.of(sandbox=2), started=str(tmp_path / "s0"),
             path=str(tmp_path / "out"), seconds=60), JobContext("busy", 1)))
    await eventually(lambda: (tmp_path / "s0").exists(), what="the first job started")
    node = cluster.add_node(num_cpus=1, resources={"rollout": 1})
    try:
        await eventually(lambda: reports[-1] == Resources.of(sandbox=4), what="capacity up")
        new = (rollout_nodes() - first).pop()
        landed, _ = await executor.run(spec(sleep_then_write, started=str(tmp_path / "s1"),
                                            path=str(tmp_path / "out"), seconds=0),
                                       JobContext("joined", 1))
        assert landed == new  # the only worker with room is the new one

        running = asyncio.ensure_future(executor.run(
            spec(sleep_then_write, Resources.of(sandbox=2), started=str(tmp_path / "s2"),
                 path=str(tmp_path / "out"), seconds=30), JobContext("doomed", 1)))
        await eventually(lambda: (tmp_path / "s2").exists(), what="the doomed job started")
        assert (tmp_path / "s2").read_text().split()[0] == new
        cluster.remove_node(node)
        node = None
        with pytest.raises(WorkerLostError, match=f"job doomed.*{new[:12]}"):
            await asyncio.wait_for(running, 20)
        await eventually(lambda: reports[-1] == SLOTS, what="capacity down")
        assert not busy.done()  # the other node's job runs on, untouched
        assert (tmp_path / "out").read_text().split() == ["joined"]
    finally:
        busy.cancel()
        if node is not None:
            cluster.remove_node(node)


async def test_a_killed_worker_process_is_lost_and_replaced(executors: Any,
                                                            tmp_path: Path) -> None:
    executor, reports = await executors()
    job = asyncio.ensure_future(executor.run(
        spec(sleep_then_write, started=str(tmp_path / "s"), path=str(tmp_path / "out"),
             seconds=30), JobContext("victim", 1)))
    await eventually(lambda: (tmp_path / "s").exists(), what="the job started")
    pid = int((tmp_path / "s").read_text().split()[1])
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerLostError, match=f"job victim.*pid {pid}"):
        await asyncio.wait_for(job, 15)
    assert not (tmp_path / "out").exists()
    await eventually(lambda: executor.workers and executor.workers[0].pid != pid,
                     what="a replacement worker")
    assert reports[-2:] == [Resources(), SLOTS]  # down, then up again on the same node
    _, new_pid, _ = await executor.run(spec(where), JobContext("after", 1))
    assert new_pid != pid


async def test_a_hung_worker_is_declared_lost_after_its_lease(executors: Any,
                                                              tmp_path: Path) -> None:
    executor, reports = await executors(lease_s=1.5)
    hung = asyncio.ensure_future(executor.run(
        spec(block_the_loop, Resources.of(sandbox=2), started=str(tmp_path / "s")),
        JobContext("hung", 1)))
    await eventually(lambda: (tmp_path / "s").exists(), what="the hung job started")
    pid = int((tmp_path / "s").read_text())
    began = time.monotonic()
    with pytest.raises(WorkerLostError, match="did not answer pings for 1.5 s"):
        await asyncio.wait_for(hung, 10)
    assert time.monotonic() - began < 1.5 + 1.0  # within the lease (+ one ping interval)
    await eventually(lambda: not pid_alive(pid), what="the hung actor killed")
    # Its room is free again: a job wanting the whole worker runs on the replacement.
    _, new_pid, _ = await asyncio.wait_for(
        executor.run(spec(where, Resources.of(sandbox=2)), JobContext("after", 1)), 15)
    assert new_pid != pid and reports[-1] == SLOTS


async def test_cancel_stops_the_remote_job_at_once_and_frees_its_room(
        executors: Any, tmp_path: Path) -> None:
    executor, _ = await executors()
    job = asyncio.ensure_future(executor.run(
        spec(sleep_then_write, Resources.of(sandbox=2), started=str(tmp_path / "s"),
             path=str(tmp_path / "out"), seconds=1.0), JobContext("cancelled", 1)))
    await eventually(lambda: (tmp_path / "s").exists(), what="the job started")
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    began = time.monotonic()
    # The whole worker is free at once: a job wanting all of it does not wait.
    await executor.run(spec(where, Resources.of(sandbox=2)), JobContext("next", 1))
    assert time.monotonic() - began < 0.8
    await asyncio.sleep(1.5)  # past when the cancelled job would have written
    assert not (tmp_path / "out").exists()
    worker = next(iter(executor._workers.values()))  # noqa: SLF001 - still alive, and idle
    assert await worker.handle.running.remote() == []


async def test_pause_and_resume_across_ray(executors: Any) -> None:
    executor, _ = await executors()
    ctx = JobContext("partial", 1)
    job = asyncio.ensure_future(executor.run(spec(count_steps, steps=40), ctx))
    await asyncio.sleep(0.5)
    ctx.request_pause()
    paused = await asyncio.wait_for(job, 5)
    assert isinstance(paused, Paused) and 3 <= len(paused.state) < 40
    resumed = JobContext("partial", 2, resume=paused.state)
    done = await executor.run(spec(count_steps, steps=40), resumed)
    assert done[:len(paused.state)] == paused.state == [1] * len(paused.state)
    assert done[len(paused.state):] == [2] * (40 - len(paused.state))  # the prefix not redone


async def test_a_pause_requested_before_the_job_starts_is_not_lost(executors: Any) -> None:
    executor, _ = await executors()
    ctx = JobContext("early", 1)
    ctx.request_pause()
    assert await executor.run(spec(count_steps, steps=40), ctx) == Paused([])


async def test_a_real_episode_in_a_local_sandbox_on_a_ray_worker(executors: Any) -> None:
    executor, _ = await executors()
    trajectory, node = await asyncio.wait_for(
        executor.run(spec(median_episode), JobContext("episode", 1)), 60)
    assert node in rollout_nodes()
    assert trajectory.status == Status.OK and trajectory.finish_reason == "submit"
    assert trajectory.reward is not None and trajectory.reward.reward == 1.0
    assert [s.action for s in trajectory.steps] == ["write_file", "submit"]


# ---- through the Scheduler ------------------------------------------------------------------

def ray_scheduler(**config: Any) -> Scheduler:
    return Scheduler(executor=RayExecutor(slots_per_worker=SLOTS, poll_s=0.3, lease_s=10.0),
                     config=SchedulerConfig(**config))


def completions(path: Path) -> list[str]:
    return sorted(path.read_text().split()) if path.exists() else []


async def test_scheduler_retries_the_jobs_of_a_removed_node_and_loses_or_doubles_none(
        ray_up: Cluster, tmp_path: Path) -> None:
    node = ray_up.add_node(num_cpus=1, resources={"rollout": 1})
    try:
        async with ray_scheduler() as sched:
            await eventually(lambda: sched.capacity == Resources.of(sandbox=4), what="2 nodes")
            handles = [await sched.submit(spec(slow_once, started=str(tmp_path / f"s{i}"),
                                               path=str(tmp_path / "out"), first_s=2.5))
                       for i in range(4)]
            await eventually(lambda: len(list(tmp_path.glob("s*.1"))) == 4, what="4 started")
            doomed = str(node.node_id)
            on_doomed = {i for i in range(4)
                         if (tmp_path / f"s{i}.1").read_text().split()[0] == doomed}
            assert len(on_doomed) == 2  # placed by free room: two on each node
            ray_up.remove_node(node)
            node = None
            results = [await asyncio.wait_for(h.result(), 20) for h in handles]
        assert [r.status for r in results] == [JobStatus.DONE] * 4
        assert {i for i, r in enumerate(results) if r.attempts == 2} == on_doomed
        assert all(r.value[0] != doomed for r in results)
        assert completions(tmp_path / "out") == sorted(h.id for h in handles)  # once each
    finally:
        if node is not None:
            ray_up.remove_node(node)


async def test_scheduler_retries_a_job_whose_worker_process_was_killed(
        ray_up: Cluster, tmp_path: Path) -> None:
    async with ray_scheduler() as sched:
        handle = await sched.submit(spec(slow_once, started=str(tmp_path / "s"),
                                         path=str(tmp_path / "out"), first_s=30))
        await eventually(lambda: (tmp_path / "s.1").exists(), what="the job started")
        pid = int((tmp_path / "s.1").read_text().split()[1])
        os.kill(pid, signal.SIGKILL)
        result = await asyncio.wait_for(handle.result(), 20)
    assert result.status is JobStatus.DONE and result.attempts == 2
    assert result.value[1] != pid and result.value[2] == 2
    assert completions(tmp_path / "out") == [handle.id]


async def test_scheduler_cancel_stops_the_remote_job_and_starts_the_next(
        ray_up: Cluster, tmp_path: Path) -> None:
    async with ray_scheduler() as sched:
        whole = Resources.of(sandbox=2)  # each job takes the whole (only) worker
        first = await sched.submit(spec(slow_once, whole, started=str(tmp_path / "a"),
                                        path=str(tmp_path / "out"), first_s=1.0))
        second = await sched.submit(spec(where, whole))
        await eventually(lambda: (tmp_path / "a.1").exists(), what="the first job started")
        assert second.status is JobStatus.QUEUED
        began = time.monotonic()
        assert first.cancel()
        assert (await asyncio.wait_for(second.result(), 5)).status is JobStatus.DONE
        assert time.monotonic() - began < 0.8
        assert (await first.result()).status is JobStatus.CANCELLED
        await asyncio.sleep(1.2)
    assert completions(tmp_path / "out") == []  # the cancelled job never reached its end


async def test_scheduler_pauses_stragglers_on_ray_and_resumes_their_prefix(
        ray_up: Cluster) -> None:
    async with ray_scheduler(stragglers="pause", pause_grace_s=5) as sched:
        handle = await sched.submit(JobSpec(functools.partial(count_steps_resumable, steps=30),
                                            demand=Resources.of(sandbox=1), deadline_s=0.6))
        result = await asyncio.wait_for(handle.result(), 20)
    assert result.status is JobStatus.DONE
    done, resumed_from = result.value
    assert done == [1] * 30 and 0 < resumed_from < 30  # resumed, not redone
    assert result.attempts == 1


# ---- inference on its own node ----------------------------------------------------------------

async def test_ray_policy_samples_from_an_inference_actor_on_the_inference_node(
        executors: Any, cluster: Cluster) -> None:
    executor, _ = await executors()
    policy = await start_inference(ScriptedPolicyConfig(actions=[("bash", {"command": "ls"})]))
    try:
        assert isinstance(policy, Policy) and policy.name == "scripted"
        assert (await policy.info()).node_id == head_node(cluster)  # the "inference" node
        generation, node = await executor.run(spec(ask_policy, policy=policy),
                                              JobContext("asks", 1))
        assert node in rollout_nodes() and node != head_node(cluster)
        assert [(c.name, c.arguments) for c in generation.tool_calls] == \
            [("bash", '{"command": "ls"}')]
    finally:
        await policy.stop()
    with pytest.raises(PolicyError, match="inference actor serving 'scripted' is gone"):
        await policy.generate(GenerateRequest(messages=[Message(role="user", content="x")]))


async def test_start_inference_without_the_resource_says_what_to_start(ray_up: Cluster
                                                                       ) -> None:
    with pytest.raises(ConfigError, match="no node offers 1 of the resource 'gpu-h100'"):
        await start_inference(ScriptedPolicyConfig(), resource="gpu-h100")


async def test_ray_policy_serves_the_tiny_local_model(executors: Any,
                                                      tiny_model_dir: Path) -> None:
    executor, _ = await executors()
    policy: RayPolicy = await start_inference(LocalPolicyConfig(model=str(tiny_model_dir)))
    try:
        generation, _ = await executor.run(spec(ask_policy, policy=policy),
                                           JobContext("model", 1))
        assert generation.completion_token_ids and len(generation.logprobs) == \
            len(generation.completion_token_ids)
    finally:
        await policy.stop()


# ---- who owns Ray ----------------------------------------------------------------------------

async def test_an_executor_that_started_ray_shuts_it_down_and_one_that_joined_does_not(
        ray_up: Cluster) -> None:
    joined = RayExecutor(slots_per_worker=SLOTS)
    await joined.start(lambda capacity: None)
    await joined.close()
    assert ray.is_initialized()
    ray.shutdown()
    owner = RayExecutor(address=ray_up.address, slots_per_worker=SLOTS,
                        init_kwargs={"log_to_driver": False,
                                             "runtime_env": RUNTIME_ENV})
    await owner.start(lambda capacity: None)
    assert owner.workers and (await owner.run(spec(where), JobContext("j", 1)))[0] in \
        rollout_nodes()
    await owner.close()
    assert not ray.is_initialized()


# ---- the scheduler's own behaviour, on Ray as on asyncio ---------------------------------

async def stamp(ctx: JobContext, *, name: str, seconds: float) -> tuple[str, float]:
    """Say when it started (the driver and the workers share this machine's clock)."""
    started = time.time()
    await asyncio.sleep(seconds)
    return name, started


def _stamp(name: str, seconds: float = 0.05, **spec: Any) -> JobSpec:
    return JobSpec(functools.partial(stamp, name=name, seconds=seconds), **spec)


async def test_scheduler_priorities_and_backfill_on_ray(ray_up: Cluster) -> None:
    two = Resources.of(sandbox=2)
    executor = RayExecutor(slots_per_worker=two, poll_s=0.3)
    async with Scheduler(executor=executor) as s:
        blocker = await s.submit(_stamp("blocker", 0.5, demand=two))
        low = await s.submit(_stamp("low", priority=0))
        high = await s.submit(_stamp("high", priority=5))
        big = await s.submit(_stamp("big", demand=two, priority=9))
        results = [await h for h in (blocker, low, high, big)]
        order = [name for name, _ in sorted((r.value for r in results), key=lambda v: v[1])]
        # big (priority 9, both slots) goes before the two small ones, which then start in
        # one placement pass on the two freed slots: which of them the worker stamps first
        # is not the scheduler's to decide (a CI run saw low a hair before high)
        assert order[:2] == ["blocker", "big"] and set(order[2:]) == {"high", "low"}
        half = await s.submit(_stamp("half", 0.5))
        big2 = await s.submit(_stamp("big2", demand=two, priority=9))
        small = await s.submit(_stamp("small"))
        results = [await h for h in (half, big2, small)]
    order = [name for name, _ in sorted((r.value for r in results), key=lambda v: v[1])]
    # big2 waits for room, small backfills beside half (the two start within the same moment,
    # in either order on the workers' clocks)
    assert order[-1] == "big2" and set(order[:2]) == {"half", "small"}


async def test_scheduler_back_pressure_deadlines_and_over_sampling_on_ray(
        ray_up: Cluster, tmp_path: Path) -> None:
    executor = RayExecutor(slots_per_worker=Resources.of(sandbox=2), poll_s=0.3)
    async with Scheduler(executor=executor, config=SchedulerConfig(max_queued=1)) as s:
        running = [await s.submit(_stamp(f"r{i}", 0.5)) for i in range(2)]
        await s.submit(_stamp("queued"))
        t0 = time.monotonic()
        waited = await s.submit(_stamp("waited"))  # back-pressure: waits for room
        # room came when one of the two running jobs ended (either: they started together)
        assert time.monotonic() - t0 > 0.2
        assert any(r.status is JobStatus.DONE for r in running)
        assert (await waited).status is JobStatus.DONE
        ran_over = tmp_path / "ran-over"
        cut = await s.submit(JobSpec(functools.partial(
            sleep_then_write, started=str(tmp_path / "cut-started"), path=str(ran_over),
            seconds=30.0), deadline_s=1.0))
        group = await s.submit_group(
            [_stamp("fast1", 0.05), _stamp("fast2", 0.05),
             JobSpec(functools.partial(sleep_then_write, started=str(tmp_path / "slow"),
                                       path=str(ran_over), seconds=30.0))], keep=2)
        kept = await group
        assert sorted(r.value[0] for r in kept) == ["fast1", "fast2"]
        assert (await cut).status is JobStatus.TIMED_OUT
        await asyncio.sleep(0.5)
    assert not ran_over.exists()  # the cut and the over-sampled jobs stopped on the worker
