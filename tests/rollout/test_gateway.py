"""The recording gateway with real parts: the official `openai` SDK, an unmodified tool-calling agent
(examples/bundles/openai_agent.py), our builtin engine, and an agent run as a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from rft_runtime.data.task import Task
from rft_runtime.rollout import (
    ChatClient,
    InferenceClient,
    RetryPolicy,
    RolloutRecorder,
    RolloutWorker,
    SamplingParams,
    load_bundle,
)
from rft_runtime.rollout.gateway import RecordingGateway
from rft_runtime.types import Trajectory

from .conftest import serve_app

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "examples" / "bundles" / "openai_agent.py"
FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02)
TOOL_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'


def _task() -> Task:
    return Task(task_id="calc-1", prompt="what is 2 + 3?", ground_truth="5")


class EngineTap:
    """Forwards `/v1/completions` to a real engine and keeps each request and the engine's own answer."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.exchanges: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.app = web.Application()
        self.app.router.add_post("/v1/completions", self._forward)

    async def _forward(self, request: web.Request) -> web.Response:
        body = await request.json()
        async with aiohttp.ClientSession() as s, s.post(self.upstream + "/v1/completions", json=body) as r:
            answer = await r.json()
            status, headers = r.status, {k: v for k, v in r.headers.items() if k.lower() == "x-policy-version"}
        if status == 200:
            self.exchanges.append((body, answer))
        return web.json_response(answer, status=status, headers=headers)


async def test_unmodified_agent_tool_calls_through_the_gateway(replay, chat_tokenizer):
    """Scripted engine replies (a calculator tool call, then the answer) through the SDK agent: one
    trajectory of two cumulative steps, the tool turn masked, reward 1."""
    server, url = replay
    tok = chat_tokenizer.tokenizer
    enc = lambda s: tok.encode(s, add_special_tokens=False) + [2]  # noqa: E731
    server.script = [enc(TOOL_CALL), enc("ANSWER: 5")]
    async with InferenceClient(url, "tiny", retry=FAST, rng=random.Random(0)) as inference:
        worker = RolloutWorker(inference, chat_tokenizer, bundle=load_bundle(str(AGENT)))
        try:
            [ep] = await worker.rollout_task(_task(), 1, SamplingParams(max_tokens=128, temperature=0.7), policy_version=7)
        finally:
            await worker.aclose()
    assert not ep.errors.any and ep.reward == 1.0 and ep.metrics["calculator_calls"] == 1, ep.errors
    [traj] = ep.trajectories
    s1, s2 = traj.steps
    assert s1.response_ids == enc(TOOL_CALL) and s2.response_ids == enc("ANSWER: 5")
    [call] = s1.metadata["tool_calls"]
    assert call["function"] == {"name": "calculator", "arguments": '{"expression": "2+3"}'}
    tool_turn = chat_tokenizer.close_assistant(s1.response_ids) + chat_tokenizer.message_delta(
        [{"role": "tool", "tool_call_id": call["id"], "content": "5"}])
    merged = traj.merged()
    assert merged.response_ids == s1.response_ids + tool_turn + s2.response_ids
    assert merged.response_mask == [1] * len(s1.response_ids) + [0] * len(tool_turn) + [1] * len(s2.response_ids)
    assert server.requests[-1]["prompt"] == s1.prompt_ids + s1.response_ids + tool_turn
    assert all(s.policy_version == 7 for s in traj.steps)


async def test_recorded_ids_equal_what_the_builtin_engine_sampled(builtin_server, chat_tokenizer):
    """The SDK agent against the builtin engine: every recorded call's prompt ids, completion ids and
    log-probs are the engine's own answer (read on the wire between the gateway and the engine)."""
    tap = EngineTap(builtin_server)
    async with serve_app(tap.app) as url, InferenceClient(url, "tiny", retry=FAST, rng=random.Random(0)) as inference:
        worker = RolloutWorker(inference, chat_tokenizer, bundle=load_bundle(str(AGENT)))
        try:
            eps = await worker.rollout_task(_task(), 2, SamplingParams(max_tokens=96, temperature=1.0, seed=3),
                                            policy_version=5)
        finally:
            await worker.aclose()
    steps = [s for ep in eps for t in ep.trajectories for s in t.steps]
    assert all(not ep.errors.any for ep in eps) and len(steps) == len(tap.exchanges) >= 2
    for step, (request, answer) in zip(sorted(steps, key=lambda s: s.metadata["seed"]),
                                       sorted(tap.exchanges, key=lambda e: e[0]["seed"])):
        [choice] = answer["choices"]
        assert step.prompt_ids == request["prompt"]
        assert step.response_ids == choice["token_ids"]
        assert step.logprobs == pytest.approx(choice["logprobs"]["token_logprobs"], abs=0)
        assert step.policy_version == 5


async def _open(gateway: RecordingGateway, url: str, chat_tokenizer, eid: str, **kw: Any) -> tuple[ChatClient, InferenceClient]:
    inference = InferenceClient(url, "tiny", retry=FAST, rng=random.Random(0))
    client = ChatClient(inference, chat_tokenizer, sampling=SamplingParams(max_tokens=128, temperature=1.0),
                        policy_version=5, recorder=RolloutRecorder(), **kw)
    await gateway.start()
    gateway.open(eid, client)
    return client, inference


async def test_streaming_completions_and_stepwise_calls(builtin_server, chat_tokenizer):
    """`stream=True` (chat and text completions) through the SDK; two calls that do not continue each
    other are two steps of one trajectory (step-wise), each its own training sample."""
    gateway = RecordingGateway()
    client, inference = await _open(gateway, builtin_server, chat_tokenizer, "t:0")
    try:
        async with AsyncOpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0) as sdk:
            chunks = [c async for c in await sdk.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True, seed=1,
                stream_options={"include_usage": True})]
            text = await sdk.completions.create(model="tiny", prompt="Once upon a time", seed=2)
            models = await sdk.models.list()
    finally:
        await gateway.aclose()
        await inference.aclose()
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    rec = client.recorder
    [traj] = rec.trajectories
    assert len(traj.samples) == 2 and [m.id for m in models.data] == ["tiny"]
    first, second = (r.sample for r in traj.samples)
    assert streamed == chat_tokenizer.decode(first.completion_ids)
    assert chunks[-1].usage.completion_tokens == len(first.completion_ids)
    assert second.prompt_ids == chat_tokenizer.encode_text("Once upon a time")
    assert text.choices[0].text == chat_tokenizer.decode(second.completion_ids)


async def test_agent_in_a_subprocess_reads_the_standard_environment(replay, chat_tokenizer):
    """The agent run as a program (its own process, `AsyncOpenAI()` configured by OPENAI_BASE_URL /
    OPENAI_API_KEY) is recorded like an in-process one."""
    server, url = replay
    tok = chat_tokenizer.tokenizer
    enc = lambda s: tok.encode(s, add_special_tokens=False) + [2]  # noqa: E731
    server.script = [enc(TOOL_CALL), enc("ANSWER: 5")]
    gateway = RecordingGateway()
    client, inference = await _open(gateway, url, chat_tokenizer, "t:1")
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
        proc = await asyncio.create_subprocess_exec(sys.executable, str(AGENT), "what is 2 + 3?",
                                                    env={**env, **client.openai_env()},
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        await gateway.aclose()
        await inference.aclose()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert json.loads(out) == {"reply": "ANSWER: 5", "calculator_calls": 1}
    [traj] = client.recorder.trajectories
    steps = Trajectory(name="default", steps=[
        {"prompt_ids": r.sample.prompt_ids, "response_ids": r.sample.completion_ids, "logprobs": r.sample.logprobs}
        for r in traj.samples])
    assert len(steps.segments()) == 1 and steps.merged().response_ids[-len(enc("ANSWER: 5")):] == enc("ANSWER: 5")


async def test_an_inference_failure_behind_a_call_gives_the_task_back(replay, chat_tokenizer):
    """The engine keeps failing: the agent's call is answered 502, and the worker raises (the task is
    released and leased again) instead of posting an episode the agent ended on its own."""
    from rft_runtime.rollout import InferenceUnavailableError

    server, url = replay
    server.faults = [503] * 10
    async with InferenceClient(url, "tiny", retry=FAST, rng=random.Random(0)) as inference:
        worker = RolloutWorker(inference, chat_tokenizer, bundle=load_bundle(str(AGENT)))
        try:
            with pytest.raises(InferenceUnavailableError):
                await worker.rollout_task(_task(), 1, SamplingParams(max_tokens=128), policy_version=7)
        finally:
            await worker.aclose()


async def test_an_agent_whose_calls_do_not_continue_each_other_trains_step_wise(replay, chat_tokenizer, tmp_path):
    """A summarising agent (its second call is a fresh context): one trajectory of two steps, which the
    trainer takes as two samples sharing the episode's reward."""
    from rft_runtime.trainer.batch import sequences_from_episode

    bundle = tmp_path / "summariser.py"
    bundle.write_text(
        "from openai import AsyncOpenAI\n\n"
        "async def rollout(task, client):\n"
        "    env = client.openai_env()\n"
        "    async with AsyncOpenAI(base_url=env['OPENAI_BASE_URL'], api_key=env['OPENAI_API_KEY']) as oa:\n"
        "        draft = await oa.chat.completions.create(model=env['OPENAI_MODEL'], messages=[{'role': 'user', 'content': task.prompt}])\n"
        "        summary = await oa.chat.completions.create(model=env['OPENAI_MODEL'], messages=[\n"
        "            {'role': 'user', 'content': 'Summarise: ' + draft.choices[0].message.content}])\n"
        "    return 1.0 if summary.choices[0].message.content == 'five' else 0.0\n")
    server, url = replay
    enc = lambda s: chat_tokenizer.tokenizer.encode(s, add_special_tokens=False) + [2]  # noqa: E731
    server.script = [enc("2 + 3 is 5"), enc("five")]
    async with InferenceClient(url, "tiny", retry=FAST, rng=random.Random(0)) as inference:
        worker = RolloutWorker(inference, chat_tokenizer, bundle=load_bundle(str(bundle)))
        try:
            [ep] = await worker.rollout_task(_task(), 1, SamplingParams(max_tokens=16), policy_version=2)
        finally:
            await worker.aclose()
    [traj] = ep.trajectories
    assert ep.reward == 1.0 and len(traj.steps) == 2 and len(traj.segments()) == 2
    draft, summary = sequences_from_episode(ep)
    assert (draft.trajectory_step, summary.trajectory_step) == (0, 1) and draft.reward == summary.reward == 1.0
    assert summary.prompt_ids == chat_tokenizer.encode_chat([{"role": "user", "content": "Summarise: 2 + 3 is 5"}],
                                                            add_generation_prompt=True)
