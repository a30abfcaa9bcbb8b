"""Fixtures for coordinator tests: a fake clock, episode builders (JSON form) and a served coordinator."""

from __future__ import annotations

from typing import Any

import pytest

from rft_runtime.coordinator import Coordinator, CoordinatorConfig, CoordinatorService
from rft_runtime.coordinator.server import CoordinatorServer


class FakeClock:
    """A manually advanced clock (seconds)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def make_episode(task_key: str, idx: int, version: int | None = 0, reward: float = 1.0) -> dict[str, Any]:
    """A minimal episode as a rollout worker posts it."""
    return {
        "id": f"{task_key}:{idx}",
        "task_id": task_key,
        "rollout_idx": idx,
        "trajectories": [{"name": "default", "reward": reward, "steps": [{
            "prompt_ids": [1, 2], "response_ids": [3], "logprobs": [-0.5], "response_mask": [1],
            "finish_reason": "stop", "truncated": False,
            **({} if version is None else {"policy_version": version})}]}],
    }


def make_tasks(k: int) -> list[dict[str, Any]]:
    """``k`` tasks in ``Task.to_dict()`` form."""
    return [{"task_id": f"t{i}", "prompt": f"q{i}", "ground_truth": str(i)} for i in range(k)]


@pytest.fixture
def episode():
    """The :func:`make_episode` builder."""
    return make_episode


@pytest.fixture
def tasks():
    """The :func:`make_tasks` builder."""
    return make_tasks


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def coord(clock: FakeClock) -> Coordinator:
    return Coordinator(CoordinatorConfig(n=2, lease_timeout_s=10.0, sampling={"max_tokens": 4}), clock=clock)


@pytest.fixture
def served():
    """A coordinator (groups of 2) served over HTTP on loopback: ``(service, server)``."""
    svc = CoordinatorService(Coordinator(CoordinatorConfig(n=2, lease_timeout_s=30.0)))
    server = CoordinatorServer(svc, "127.0.0.1", 0).start()
    try:
        yield svc, server
    finally:
        server.stop()
