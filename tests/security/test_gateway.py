"""Bad input at the recording gateway (rft_runtime.rollout.gateway), over real HTTP in front of a
real engine replaying recorded vLLM answers: every refusal is an OpenAI-shaped error
(``{"error": {"message", "type", "param", "code"}}``) naming the problem, the official SDK raises the
matching exception, and nothing is recorded or sent to the engine."""

from __future__ import annotations

import contextlib
import random
import textwrap
from typing import Any, AsyncIterator

import aiohttp
import openai
import pytest

from rft_runtime.data.task import Task
from rft_runtime.rollout import (
    ChatClient,
    ChatTokenizer,
    InferenceClient,
    RetryPolicy,
    RolloutRecorder,
    RolloutWorker,
    SamplingParams,
    load_bundle,
)
from rft_runtime.rollout.gateway import RecordingGateway
from tests.rollout.conftest import TINY_MODEL, ReplayServer, serve_app

FAST = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02)
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def tokenizer() -> ChatTokenizer:
    return ChatTokenizer.from_pretrained(TINY_MODEL)


@contextlib.asynccontextmanager
async def gateway_with(tokenizer: ChatTokenizer, *, max_request_bytes: int = 2**20, max_prompt_tokens: int = 200,
                       max_turns: int | None = None) -> AsyncIterator[tuple[RecordingGateway, Any, ReplayServer]]:
    """A started gateway with episode ``t:0`` open (client, replay engine)."""
    server = ReplayServer()
    async with serve_app(server.app) as url, InferenceClient(url, "tiny", retry=FAST, rng=random.Random(0)) as inference:
        client = ChatClient(inference, tokenizer, sampling=SamplingParams(max_tokens=16), policy_version=3,
                            recorder=RolloutRecorder(), max_prompt_tokens=max_prompt_tokens, max_turns=max_turns)
        gateway = RecordingGateway(max_request_bytes=max_request_bytes)
        await gateway.start()
        endpoint = gateway.open("t:0", client)
        try:
            yield gateway, endpoint, server
        finally:
            await gateway.aclose()


async def _post(url: str, body: Any, key: str | None, *, raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    async with aiohttp.ClientSession() as s:
        kw: dict[str, Any] = {"data": raw, "headers": {**headers, "Content-Type": "application/json"}} if raw is not None \
            else {"json": body, "headers": headers}
        async with s.post(url, **kw) as r:
            return r.status, await r.json()


def _refused(status: int, answer: dict[str, Any], want_status: int, code: str | None, param: str | None,
             words: str) -> None:
    assert status == want_status, answer
    err = answer["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code and err["param"] == param and words in err["message"], err


def _nothing_recorded(endpoint: Any, server: ReplayServer) -> None:
    assert endpoint.client.recorder.samples == [] and server.requests == [] and endpoint.calls == 0


async def test_an_episode_not_open_here_is_refused(tokenizer):
    async with gateway_with(tokenizer) as (gw, ep, server):
        status, answer = await _post(f"{gw.url}/e/other:0/v1/chat/completions",
                                     {"model": "tiny", "messages": HELLO}, ep.api_key)
        _refused(status, answer, 404, "episode_not_found", None, "'other:0' is not being rolled out by this pod")
        _nothing_recorded(ep, server)


async def test_a_call_after_the_episode_finished_is_refused(tokenizer):
    async with gateway_with(tokenizer) as (gw, ep, server):
        gw.close(ep)
        async with openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=0) as sdk:
            with pytest.raises(openai.ConflictError, match="is finished"):
                await sdk.chat.completions.create(model="tiny", messages=HELLO)
        _nothing_recorded(ep, server)


@pytest.mark.parametrize("key", [None, "", "rft-ep-guessed", "other-episode"])
async def test_a_missing_or_wrong_key_is_refused(tokenizer, key):
    async with gateway_with(tokenizer) as (gw, ep, server):
        if key == "other-episode":  # the key of another open episode does not open this one
            other = ChatClient(ep.client.inference, tokenizer, sampling=SamplingParams(max_tokens=16), policy_version=3)
            key = gw.open("t:1", other).api_key
        status, answer = await _post(f"{ep.base_url}/chat/completions", {"model": "tiny", "messages": HELLO}, key)
        _refused(status, answer, 401, "invalid_api_key", None, "missing or wrong API key for episode 't:0'")
        assert answer["error"]["type"] == "authentication_error"
        _nothing_recorded(ep, server)


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
async def test_a_model_that_is_not_the_served_one_is_refused(tokenizer, route):
    async with gateway_with(tokenizer) as (gw, ep, server):
        body = {"model": "gpt-4o", "messages": HELLO, "prompt": "hi"}
        body.pop("prompt" if route.startswith("chat") else "messages")
        status, answer = await _post(f"{ep.base_url}/{route}", body, ep.api_key)
        _refused(status, answer, 404, "model_not_found", "model", "'gpt-4o' is not served to episode 't:0'")
        async with openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=0) as sdk:
            with pytest.raises(openai.NotFoundError):
                await sdk.chat.completions.create(model="tiny-v2", messages=HELLO)
        _nothing_recorded(ep, server)


async def test_requests_over_the_length_limits_are_refused(tokenizer):
    async with gateway_with(tokenizer, max_prompt_tokens=40) as (gw, ep, server):
        url = f"{ep.base_url}/chat/completions"
        status, answer = await _post(url, {"model": "tiny", "messages": HELLO, "max_tokens": 17}, ep.api_key)
        _refused(status, answer, 400, "max_tokens_exceeded", "max_tokens", "more than the job's maxOutputTokens 16")
        long = [{"role": "user", "content": "x " * 100}]
        status, answer = await _post(url, {"model": "tiny", "messages": long}, ep.api_key)
        _refused(status, answer, 400, "context_length_exceeded", "messages", "above rollout.maxPromptTokens (40)")
        status, answer = await _post(f"{ep.base_url}/completions", {"model": "tiny", "prompt": "x " * 100}, ep.api_key)
        _refused(status, answer, 400, "context_length_exceeded", "prompt", "rollout.maxPromptTokens 40")
        _nothing_recorded(ep, server)
    async with gateway_with(tokenizer, max_request_bytes=4096) as (gw, ep, server):
        status, answer = await _post(f"{ep.base_url}/chat/completions", None, ep.api_key,
                                     raw=b'{"model": "tiny", "messages": [{"role": "user", "content": "' + b"y" * 8192 + b'"}]}')
        _refused(status, answer, 413, "request_too_large", None, "larger than the gateway's limit of 4096 bytes")
        _nothing_recorded(ep, server)


@pytest.mark.parametrize("body, param, words", [
    ({"logit_bias": {"5": 3}}, "logit_bias", "logit_bias is refused"),
    ({"presence_penalty": 0.5}, "presence_penalty", "presence_penalty is refused"),
    ({"response_format": {"type": "json_object"}}, "response_format", "unsupported argument(s): response_format"),
    ({"n": 0}, "n", "n must be an integer >= 1"),
    ({"messages": []}, "messages", "messages must be a non-empty list"),
    ({"extra_body": {"min_p": 0.1}}, "extra_body", "extra_body is not supported"),
])
async def test_arguments_the_trainer_cannot_reproduce_are_refused(tokenizer, body, param, words):
    async with gateway_with(tokenizer) as (gw, ep, server):
        status, answer = await _post(f"{ep.base_url}/chat/completions",
                                     {"model": "tiny", "messages": HELLO, **body}, ep.api_key)
        _refused(status, answer, 400, None, param, words)
        _nothing_recorded(ep, server)


async def test_a_body_that_is_not_json_is_refused(tokenizer):
    async with gateway_with(tokenizer) as (gw, ep, server):
        status, answer = await _post(f"{ep.base_url}/chat/completions", None, ep.api_key, raw=b"{not json")
        _refused(status, answer, 400, None, None, "the request body is not JSON")
        _nothing_recorded(ep, server)


async def test_a_turn_over_max_turns_is_refused_and_ends_the_episode(tokenizer, tmp_path):
    """The refused call records nothing; the episode ends with termination max_turns and is scored
    with what it sampled, whatever the agent does with the error."""
    bundle = tmp_path / "agent.py"
    bundle.write_text(textwrap.dedent("""
        from openai import AsyncOpenAI

        async def rollout(task, client):
            env = client.openai_env()
            async with AsyncOpenAI(base_url=env["OPENAI_BASE_URL"], api_key=env["OPENAI_API_KEY"], max_retries=0) as oa:
                messages = [{"role": "user", "content": "hello"}]
                for _ in range(3):
                    reply = (await oa.chat.completions.create(model=env["OPENAI_MODEL"], messages=messages)).choices[0].message
                    messages += [reply, {"role": "user", "content": "again"}]

        def score(sample, item):
            return 0.5
    """))
    server = ReplayServer()
    async with serve_app(server.app) as url, InferenceClient(url, "tiny", retry=FAST, rng=random.Random(0)) as inference:
        worker = RolloutWorker(inference, tokenizer, bundle=load_bundle(str(bundle)), max_turns=1)
        try:
            [ep] = await worker.rollout_task(Task(task_id="t", prompt="hello"), 1, SamplingParams(max_tokens=16), 3)
        finally:
            await worker.aclose()
    assert ep.termination_reason == "max_turns" and not ep.errors.any and ep.reward == 0.5
    assert len(ep.trajectories[0].steps) == 1 and len(server.requests) == 1


async def test_a_call_in_flight_when_the_episode_ends_is_not_recorded(tokenizer):
    """The rollout returned (its episode is built) while one of its agent's calls was still sampling:
    that call's sample is never added to the episode."""
    import asyncio

    async with gateway_with(tokenizer) as (gw, ep, server):
        server.delay_s = 0.5
        recorder = ep.client.recorder
        call = asyncio.create_task(_post(f"{ep.base_url}/chat/completions", {"model": "tiny", "messages": HELLO},
                                         ep.api_key))
        while not server.requests:  # the engine has the request
            await asyncio.sleep(0.01)
        gw.close(ep)
        status, _ = await call
        assert status == 200 and recorder.samples == [] and recorder.trajectories == []
