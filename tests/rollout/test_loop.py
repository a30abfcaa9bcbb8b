"""The rollout loop against a real coordinator over HTTP, with a stand-in worker (no engine): each task
is sampled with its grant's ``n`` and sampling, and the samples in flight stay within ``concurrency``
counting every task's own ``n``."""

from __future__ import annotations

import asyncio

import pytest

from rft_api.job import validate_spec
from rft_runtime.coordinator import Coordinator, CoordinatorConfig, CoordinatorService
from rft_runtime.coordinator.server import CoordinatorServer
from rft_runtime.rollout.coordinator_client import CoordinatorClient
from rft_runtime.rollout.loop import RolloutLoop
from rft_runtime.rollout.posting import EpisodePoster
from rft_runtime.rollout.sampling import SamplingParams
from rft_runtime.types import Episode
from tests.support.runtime_config import local_config


class _Worker:
    """Rolls out a task instantly (after a beat), recording what it was asked and the samples in flight."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, SamplingParams, int]] = []
        self.in_flight = 0
        self.peak = 0

    async def rollout_task(self, task: dict, n: int, sampling: SamplingParams, policy_version: int) -> list[Episode]:
        self.calls.append((task["task_id"], n, sampling, policy_version))
        self.in_flight += n
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(0.05)
        self.in_flight -= n
        return [Episode.model_validate({
            "id": f"{task['task_id']}:{i}", "task_id": task["task_id"], "rollout_idx": i,
            "trajectories": [{"name": "default", "reward": 1.0, "steps": [{
                "prompt_ids": [1, 2], "response_ids": [3], "logprobs": [-0.5], "response_mask": [1],
                "finish_reason": "stop", "truncated": False, "policy_version": policy_version}]}]})
            for i in range(n)]


def _tasks(k: int) -> list[dict]:
    return [{"task_id": f"t{i}", "prompt": f"q{i}", "ground_truth": str(i)} for i in range(k)]


def _loop(tmp_path, concurrency: int, samples_per_prompt: int) -> RolloutLoop:
    spec = validate_spec({
        "model": {"base": "/models/tiny"},
        "dataset": {"train": {"builtin": "arithmetic", "size": 8}},
        "evaluator": {"builtin": "regex", "config": {"pattern": "[0-9]"}},
        "rollout": {"samplesPerPrompt": samples_per_prompt, "maxTokens": 7, "temperature": 0.9,
                    "concurrency": concurrency},
        "trainer": {"algorithm": "grpo"},
    })
    cfg = local_config("job", spec, inference=["http://127.0.0.1:9"], checkpoints=tmp_path / "ckpt",
                       output=tmp_path / "out")
    return RolloutLoop(cfg, worker_id="w", poll_s=0.02, lease_wait_s=0.2)


@pytest.mark.parametrize("concurrency", [8, 2])
async def test_each_task_is_sampled_with_its_grants_n_within_the_sample_budget(tmp_path, concurrency):
    loop = _loop(tmp_path, concurrency=concurrency, samples_per_prompt=4)
    svc = CoordinatorService(Coordinator(CoordinatorConfig(n=4, lease_timeout_s=30, sampling={"max_tokens": 5})))
    train = svc.submit(_tasks(3), seeds=[10, 20, 30])
    evals = svc.submit(_tasks(4), seeds=[1, 2, 3, 4], n=1, purpose="eval", sampling={"temperature": 0.0})
    worker = _Worker()
    with CoordinatorServer(svc, "127.0.0.1", 0) as server:
        async with CoordinatorClient(server.url) as coord:
            poster = EpisodePoster(coord, "w")
            running = asyncio.create_task(loop._loop(coord, poster, worker, None))
            groups = await asyncio.get_running_loop().run_in_executor(
                None, lambda: svc.collect(train + evals, stall_timeout_s=30))
            svc.finish()
            await asyncio.wait_for(running, 30)
            await poster.aclose()
    assert groups is not None and [len(g.episodes) for g in groups] == [4, 4, 4, 1, 1, 1, 1]
    assert loop.stats.ended == "done" and loop.stats.tasks_done == 7 and loop.stats.episodes_accepted == 16
    by_key = {c[0]: c for c in worker.calls}
    assert {k: by_key[k][1] for k in train + evals} == {**{k: 4 for k in train}, **{k: 1 for k in evals}}
    # the grant's sampling, the job's rollout settings where the grant leaves a field out
    assert by_key[train[0]][2] == SamplingParams(max_tokens=5, temperature=0.9, seed=10)
    assert by_key[evals[0]][2] == SamplingParams(max_tokens=7, temperature=0.0, seed=1)
    # a lease never takes more samples than the budget holds, but one task fits even when larger than it
    assert worker.peak <= max(concurrency, 4)


def test_a_lease_asks_for_the_room_left_in_tasks_of_the_jobs_group_size(tmp_path):
    loop = _loop(tmp_path, concurrency=8, samples_per_prompt=4)
    assert [loop._lease_size(s) for s in (0, 1, 4, 5, 8, 9)] == [2, 1, 1, 0, 0, -1]
    assert _loop(tmp_path, concurrency=2, samples_per_prompt=4)._lease_size(0) == 1  # one task when idle
