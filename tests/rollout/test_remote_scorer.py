"""The rollout role's RemoteScorer against the real reward HTTP server: a reward role that is not up
yet, or answers 503 for a while, costs retries, not episodes; a final answer (4xx) and a server that
never comes are reported with the reward service's URL and the last failure."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import pytest
from aiohttp import web

from rft_runtime.data.task import Task
from rft_runtime.rewards import RewardService, Sample
from rft_runtime.rewards.server import make_app
from rft_runtime.rollout.retry import RetryPolicy
from rft_runtime.rollout.scoring import RemoteScorer
from tests.support.ports import free_port

FAST = RetryPolicy(max_attempts=40, initial_backoff_s=0.05, max_backoff_s=0.2, deadline_s=20, attempt_timeout_s=10)


def _task() -> Task:
    return Task(task_id="t1", prompt="2+2?", ground_truth="4", domain="arithmetic")


def _samples() -> list[Sample]:
    return [Sample(id="t1:0", text="#### 4"), Sample(id="t1:1", text="#### 5")]


async def _serve(port: int, app: web.Application) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def _gated(app: web.Application, refusals: int, status: int) -> tuple[web.Application, list[int]]:
    """``app`` behind a middleware that answers ``status`` to the first ``refusals`` requests."""
    seen: list[int] = []

    @web.middleware
    async def gate(request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]) -> Any:
        seen.append(1)
        if len(seen) <= refusals:
            return web.json_response({"error": "not ready"}, status=status)
        return await handler(request)

    app.middlewares.insert(0, gate)
    return app, seen


async def test_a_reward_role_that_starts_late_costs_retries_not_episodes() -> None:
    port = free_port()
    scorer = RemoteScorer(f"http://127.0.0.1:{port}", retry=FAST)
    service = RewardService.from_config({"builtin": "math"})

    async def start_later() -> web.AppRunner:
        await asyncio.sleep(0.6)  # connections are refused until then
        return await _serve(port, make_app(service))

    starter = asyncio.create_task(start_later())
    try:
        results = await scorer.score_group(_samples(), _task())
        assert [r.reward for r in results] == [1.0, 0.0] and results[0].error is None
        assert scorer.retries >= 1
    finally:
        await (await starter).cleanup()
        await scorer.aclose()


@pytest.mark.parametrize("status", [503, 429])
async def test_unavailable_answers_are_retried(status: int) -> None:
    port = free_port()
    app, seen = _gated(make_app(RewardService.from_config({"builtin": "math"})), refusals=3, status=status)
    runner = await _serve(port, app)
    scorer = RemoteScorer(f"http://127.0.0.1:{port}", retry=FAST)
    try:
        result = await scorer(_samples()[0], _task())
        assert result.reward == 1.0 and len(seen) == 4 and scorer.retries == 3
    finally:
        await scorer.aclose()
        await runner.cleanup()


async def test_a_final_answer_is_not_retried() -> None:
    port = free_port()
    app, seen = _gated(make_app(RewardService.from_config({"builtin": "math"})), refusals=100, status=401)
    runner = await _serve(port, app)
    scorer = RemoteScorer(f"http://127.0.0.1:{port}", retry=FAST)
    try:
        with pytest.raises(RuntimeError, match=rf"reward service http://127.0.0.1:{port}: HTTP 401: .*not ready.* 1 attempt"):
            await scorer(_samples()[0], _task())
        assert len(seen) == 1 and scorer.retries == 0
    finally:
        await scorer.aclose()
        await runner.cleanup()


async def test_a_reward_role_that_never_comes_fails_within_the_deadline() -> None:
    port = free_port()
    policy = RetryPolicy(max_attempts=100, initial_backoff_s=0.05, max_backoff_s=0.1, deadline_s=0.8, attempt_timeout_s=0.5)
    scorer = RemoteScorer(f"http://127.0.0.1:{port}", retry=policy)
    try:
        with pytest.raises(RuntimeError, match=rf"reward service http://127.0.0.1:{port}: ClientConnectorError"):
            await scorer(_samples()[0], _task())
        assert 2 <= scorer.retries < 99  # ended by the deadline, not by the attempt cap
    finally:
        await scorer.aclose()
