"""`InferenceClient` over real HTTP: recorded vLLM answers, retries, errors, replicas, concurrency."""

from __future__ import annotations

import asyncio
import random

import pytest

from rft_runtime.rollout import (
    InferenceClient,
    InferenceHTTPError,
    InferenceUnavailableError,
    RetryPolicy,
    SamplingParams,
    TokenContractError,
)

from .conftest import ReplayServer, load_fixture, serve_app

FAST = RetryPolicy(max_attempts=5, initial_backoff_s=0.01, max_backoff_s=0.05, deadline_s=30)
FX = load_fixture("processed_logprobs", "completions_tokens_in_logprobs")
PROMPT = FX["request"]["prompt"]
SAMPLING = SamplingParams(max_tokens=6, temperature=0.7, seed=7)


def client(url, **kw):
    kw.setdefault("retry", FAST)
    return InferenceClient(url, "tiny", rng=random.Random(0), **kw)


async def test_complete_returns_recorded_vllm_sample(replay):
    server, url = replay
    async with client(url) as c:
        [s] = await c.complete(PROMPT, 1, SAMPLING, policy_version=5)
    choice = FX["response"]["choices"][0]
    assert s.completion_ids == choice["token_ids"]
    assert s.logprobs == choice["logprobs"]["token_logprobs"]
    assert s.prompt_ids == PROMPT and s.truncated and s.policy_version == 5
    [sent] = server.requests
    assert sent["prompt"] == PROMPT and sent["n"] == 1 and sent["seed"] == 7
    assert sent["logprobs"] == 1 and sent["return_token_ids"] and sent["return_tokens_as_token_ids"]


async def test_policy_version_from_header(replay):
    server, url = replay
    server.policy_version = 12
    async with client(url) as c:
        [s] = await c.complete(PROMPT, 1, SAMPLING, policy_version=5)
    assert s.policy_version == 12


async def test_a_replica_behind_the_granted_version_is_retried_until_it_catches_up(replay):
    """A replica serving an older policy version than the task was granted (restarted, or not yet
    given the newest version; -1: nothing published) is never recorded: the request is retried."""
    server, url = replay
    server.policy_version = -1
    async with client(url, retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02)) as c:
        with pytest.raises(InferenceUnavailableError, match="serves policy version -1, the task was granted 4"):
            await c.complete(PROMPT, 1, SAMPLING, policy_version=4)
        assert c.stats["replica_behind"] == 3
    server.policy_version = 3
    patient = RetryPolicy(max_attempts=1000, initial_backoff_s=0.01, max_backoff_s=0.02, deadline_s=60)
    async with client(url, retry=patient) as c:
        async def catch_up() -> None:
            while c.stats["replica_behind"] < 2:  # the trainer brings the replica up to date meanwhile
                await asyncio.sleep(0.005)
            server.policy_version = 4
        task = asyncio.create_task(catch_up())
        [s] = await c.complete(PROMPT, 1, SAMPLING, policy_version=4)
        await task
    assert s.policy_version == 4 and c.stats["replica_behind"] >= 2


async def test_retries_429_503_drop_and_abort_then_succeeds(replay):
    server, url = replay
    server.faults = [429, (503, 0), "drop", "abort", 500]
    async with client(url, retry=RetryPolicy(max_attempts=6, initial_backoff_s=0.01, max_backoff_s=0.05)) as c:
        [s] = await c.complete(PROMPT, 1, SAMPLING)
        assert c.stats["retries"] == 5
    assert s.completion_ids == FX["response"]["choices"][0]["token_ids"]
    assert len(server.requests) == 6 and all(r == server.requests[0] for r in server.requests)


async def test_425_is_retried(replay):
    server, url = replay
    server.faults = [425]
    async with client(url) as c:
        await c.complete(PROMPT, 1, SAMPLING)
    assert len(server.requests) == 2


async def test_retries_exhausted(replay):
    server, url = replay
    server.faults = [503] * 10
    async with client(url, retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02)) as c:
        with pytest.raises(InferenceUnavailableError, match="after 3 attempt") as ei:
            await c.complete(PROMPT, 1, SAMPLING)
    assert "injected 503" in ei.value.last_error
    assert len(server.requests) == 3


@pytest.mark.parametrize("case, status, message", [
    ("error_bad_token_id", 400, "Token id 999999 is out of vocabulary"),
    ("error_unknown_model", 404, "does not exist"),
    ("error_context_overflow", 400, "cannot be greater than max_model_len"),
])
async def test_non_retryable_4xx_raises_with_server_message(replay, case, status, message):
    server, url = replay
    fx = load_fixture("processed_logprobs", case)
    req = fx["request"]
    sampling = SamplingParams(max_tokens=req["max_tokens"], temperature=req["temperature"], seed=req["seed"])
    # These recordings were made without the logprob flags; replay them for our request.
    server.recorded = {}
    server.faults = [lambda body: None]
    server.derive = False
    server._answer = lambda body: (fx["status"], fx["response"])
    async with InferenceClient(url, req["model"], retry=FAST) as c:
        with pytest.raises(InferenceHTTPError, match=message) as ei:
            await c.complete(req["prompt"], 1, sampling)
    assert ei.value.status == status
    assert len(server.requests) == 1  # not retried
    if case == "error_context_overflow":
        assert ei.value.param == "max_tokens"


async def test_attempt_timeout_and_deadline(replay):
    server, url = replay
    server.faults = ["hang", "hang", "hang"]
    policy = RetryPolicy(max_attempts=10, initial_backoff_s=0.01, max_backoff_s=0.02, attempt_timeout_s=0.2, deadline_s=0.5)
    async with client(url, retry=policy) as c:
        with pytest.raises(InferenceUnavailableError, match="Timeout"):
            await c.complete(PROMPT, 1, SAMPLING)
    assert 2 <= len(server.requests) <= 3


async def test_contract_violation_is_not_retried(replay):
    server, url = replay
    server.faults = [lambda body: body["choices"][0]["prompt_token_ids"].pop()]
    async with client(url) as c:
        with pytest.raises(TokenContractError, match="echoed prompt_token_ids differ"):
            await c.complete(PROMPT, 1, SAMPLING)
    assert len(server.requests) == 1


async def test_n_samples_distinct_seeds_and_failed_sample_retried_alone(replay):
    server, url = replay
    server.seed_faults = {9: [503, "drop"]}
    async with client(url) as c:
        out = await c.complete(PROMPT, 4, SamplingParams(max_tokens=3, temperature=0.7, seed=7))
    assert [s.seed for s in out] == [7, 8, 9, 10]
    seeds = sorted(r["seed"] for r in server.requests)
    assert seeds == [7, 8, 9, 9, 9, 10]  # only the failing sample was re-sent
    assert all(len(s.completion_ids) == 3 for s in out)


async def test_random_seeds_when_none_given(replay):
    server, url = replay
    async with client(url) as c:
        out = await c.complete(PROMPT, 3, SamplingParams(max_tokens=2))
    seeds = [r["seed"] for r in server.requests]
    assert len(set(seeds)) == 3 and sorted(s.seed for s in out) == sorted(seeds)


async def test_round_robin_over_replicas():
    a, b = ReplayServer(), ReplayServer()
    async with serve_app(a.app) as ua, serve_app(b.app) as ub:
        async with client([ua, ub]) as c:
            out = await c.complete(PROMPT, 6, SamplingParams(max_tokens=2, seed=1))
        a.faults = [503]
        async with client([ua, ub]) as c:
            [s] = await c.complete(PROMPT, 1, SamplingParams(max_tokens=2, seed=1))
    assert len(a.requests) == 4 and len(b.requests) == 4
    assert {x.server for x in out} == {ua, ub}
    assert s.server == ub  # the retry went to the other replica


async def test_concurrency_limit_is_shared_by_calls():
    server = ReplayServer(delay_s=0.05)
    async with serve_app(server.app) as url:
        async with client(url, max_concurrency=2) as c:
            await asyncio.gather(*(c.complete(PROMPT, 3, SamplingParams(max_tokens=2)) for _ in range(3)))
    assert len(server.requests) == 9
    assert server.max_in_flight == 2


async def test_bad_arguments():
    with pytest.raises(ValueError, match="base_urls"):
        InferenceClient("localhost:8000", "tiny")
    async with InferenceClient("http://127.0.0.1:9", "tiny") as c:
        with pytest.raises(ValueError, match="n must be"):
            await c.complete([1, 2], 0)
        with pytest.raises(TokenContractError, match="prompt_ids"):
            await c.complete([1, "a"], 1)  # type: ignore[list-item]


async def test_connection_refused_is_retried_then_fails():
    retry = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.01)
    async with InferenceClient("http://127.0.0.1:9", "tiny", retry=retry) as c:
        with pytest.raises(InferenceUnavailableError, match="ClientConnectorError.*127.0.0.1:9"):
            await c.complete([1, 2], 1)


async def test_one_request_of_n_draws_the_samples_of_n_single_requests(real_server):
    """``n_per_request``: one request with ``n`` and the base seed draws exactly what ``n`` single
    requests with consecutive seeds draw (vLLM's rule, and the builtin server's: choice ``j`` is
    seeded ``seed + j``), so batching the samples changes no sample."""
    sampling = SamplingParams(max_tokens=6, temperature=1.0, seed=31)
    async with InferenceClient(real_server, "tiny", retry=FAST) as single, \
            InferenceClient(real_server, "tiny", retry=FAST, n_per_request=True) as batched:
        apart = await single.complete(PROMPT, 4, sampling)
        together = await batched.complete(PROMPT, 4, sampling)
    assert single.stats["requests"] == 4 and batched.stats["requests"] == 1
    assert [s.seed for s in together] == [31, 32, 33, 34]
    assert [s.completion_ids for s in together] == [s.completion_ids for s in apart]
    for a, b in zip(apart, together):
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-5)
    assert len({tuple(s.completion_ids) for s in together}) > 1  # distinct seeds, distinct samples


async def test_a_failed_request_of_n_is_retried_whole_with_the_same_seeds(replay):
    server, url = replay
    server.faults = [503, "drop", "abort"]
    async with client(url, n_per_request=True) as c:
        out = await c.complete(PROMPT, 3, SamplingParams(max_tokens=3, temperature=0.7, seed=7))
    assert [s.seed for s in out] == [7, 8, 9]
    assert [(r["n"], r["seed"]) for r in server.requests] == [(3, 7)] * 4  # three failures, then the answer
    assert c.stats["retries"] == 3


async def test_samples_in_flight_are_bounded_when_requests_carry_several():
    """The concurrency limit counts samples: with 4 slots, requests of 3 samples go one at a time,
    and a request of more samples than slots takes them all rather than waiting forever."""
    server = ReplayServer(delay_s=0.05)
    async with serve_app(server.app) as url:
        async with client(url, max_concurrency=4, n_per_request=True) as c:
            await asyncio.gather(*(c.complete(PROMPT, 3, SamplingParams(max_tokens=2)) for _ in range(3)),
                                 c.complete(PROMPT, 6, SamplingParams(max_tokens=2)))
    assert sorted(r["n"] for r in server.requests) == [3, 3, 3, 6]
    assert server.max_in_flight == 1


async def test_seeds_that_are_not_consecutive_go_one_request_each(replay):
    server, url = replay
    async with client(url, n_per_request=True) as c:
        out = await c.complete(PROMPT, 3, SamplingParams(max_tokens=2), seeds=[5, 50, 500])
    assert sorted(r["seed"] for r in server.requests) == [5, 50, 500] and [s.seed for s in out] == [5, 50, 500]
    assert all(r["n"] == 1 for r in server.requests)


async def test_a_lazy_session_opens_in_the_loop_at_first_use_and_opens_again_after_closing():
    """The rollout worker's clients are built before their event loop runs: `LazySession` opens the
    aiohttp session at the first request (with the client's headers and connection limit) and closes
    it in `aclose`; a later request opens a new one."""
    from aiohttp import web

    from rft_runtime.timeouts import LazySession

    seen: list[str | None] = []

    async def echo(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/x", echo)
    lazy = LazySession(["http://127.0.0.1"], {"Authorization": "Bearer t0k"}, total_s=5.0, connections=3)
    await lazy.aclose()  # never opened: nothing to close
    async with serve_app(app) as url:
        first = lazy.get()
        assert lazy.get() is first and first.connector.limit == 3 and first.timeout.total == 5.0
        async with first.get(url + "/x") as resp:
            assert resp.status == 200
        await lazy.aclose()
        assert first.closed
        second = lazy.get()
        assert second is not first and not second.closed
        async with second.get(url + "/x") as resp:
            assert resp.status == 200
        await lazy.aclose()
    assert seen == ["Bearer t0k", "Bearer t0k"] and second.closed
