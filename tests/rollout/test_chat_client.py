"""The OpenAI-shaped chat client: shape, recording, id reuse across turns, sync facade."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

from rft_runtime.rollout import (
    ChatClient,
    InferenceClient,
    RetryPolicy,
    SamplingParams,
    SyncChatClient,
)

from .conftest import OPEN_CLIENTS, load_fixture

FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02)
JOB = SamplingParams(max_tokens=12, temperature=0.7)
USER = [{"role": "user", "content": "what is 2 + 3?"}]


pytestmark = pytest.mark.usefixtures("close_clients")


def make_client(url, chat_tokenizer, **kw) -> ChatClient:
    inference = InferenceClient(url, "tiny", retry=FAST, rng=random.Random(1))
    OPEN_CLIENTS.append(inference)
    return ChatClient(inference, chat_tokenizer, sampling=kw.pop("sampling", JOB), policy_version=kw.pop("policy_version", 2), **kw)


async def test_shape_and_recording_against_tiny_model(tiny_server, chat_tokenizer):
    engine, url = tiny_server
    client = make_client(url, chat_tokenizer)
    resp = await client.chat.completions.create(model="gpt-4o-mini", messages=USER, n=3, max_tokens=8, temperature=0.0)
    assert resp.object == "chat.completion" and len(resp.choices) == 3
    assert [c.index for c in resp.choices] == [0, 1, 2]
    for c in resp.choices:
        assert c.message.role == "assistant" and isinstance(c.message.content, str)
        assert c.finish_reason in ("stop", "length")
    assert resp.usage.prompt_tokens == 25
    assert resp.usage.completion_tokens == sum(len(c.token_ids) for c in resp.choices)
    assert resp.prompt_token_ids == load_fixture("processed_logprobs", "tokenize_chat")["response"]["tokens"]
    # The job's temperature applied (the bundle's 0.0 was ignored); max_tokens may only lower the limit.
    assert {r["temperature"] for r in engine.requests} == {0.7} and {r["max_tokens"] for r in engine.requests} == {8}
    recs = client.recorder.samples
    assert len(recs) == 3 and len(client.recorder.trajectories) == 3
    for c, rec in zip(resp.choices, recs):
        s = rec.sample
        assert s.prompt_ids == resp.prompt_token_ids and s.completion_ids == c.token_ids
        assert len(s.logprobs) == len(s.completion_ids) and s.policy_version == 3  # engine-reported
    assert resp.model_dump()["choices"][0]["message"]["role"] == "assistant"


async def test_follow_up_reuses_sampled_ids(replay, chat_tokenizer):
    """The bundle sends the whole history back; the earlier assistant turn keeps its sampled ids even
    though its text would re-tokenise differently."""
    server, url = replay
    garbage = load_fixture("processed_logprobs", "completions_tokens_in_logprobs")["response"]["choices"][0]["token_ids"]
    tok = chat_tokenizer.tokenizer
    answer = tok.encode("5", add_special_tokens=False) + [2]
    server.script = [garbage + [2], answer]
    client = make_client(url, chat_tokenizer)
    r1 = await client.chat.completions.create(model="m", messages=USER)
    history = [*USER, r1.choices[0].message, {"role": "user", "content": "so?"}]  # message object
    r2 = await client.chat.completions.create(model="m", messages=history)
    first_prompt, second_prompt = server.requests[0]["prompt"], server.requests[1]["prompt"]
    assert second_prompt[: len(first_prompt) + 7] == first_prompt + garbage + [2]
    assert second_prompt == r2.prompt_token_ids
    assert tok.encode(r1.choices[0].message.content, add_special_tokens=False) != garbage  # text does not round-trip
    [traj] = client.recorder.trajectories  # one chain: the follow-up continued the first sample
    assert [s.index for s in traj.samples] == [0, 1]
    prompt, resp, mask, lps = traj.flat()
    assert prompt == first_prompt
    assert resp[:7] == garbage + [2] and mask[:7] == [1] * 7
    gap = len(second_prompt) - len(first_prompt) - 7
    assert mask[7 : 7 + gap] == [0] * gap and resp[7 + gap :] == answer
    # A dict copy of the assistant message (what `model_dump()` gives) continues the same way.
    server.script = [answer]
    history_dicts = [*USER, r1.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "so?"}]
    await client.chat.completions.create(model="m", messages=history_dicts)
    assert server.requests[2]["prompt"] == second_prompt
    assert len(client.recorder.trajectories) == 2  # a second continuation of sample 0 is a fork


async def test_edited_assistant_message_is_template_text(replay, chat_tokenizer):
    server, url = replay
    server.script = [[70, 71, 2], [72, 2]]
    client = make_client(url, chat_tokenizer)
    await client.chat.completions.create(model="m", messages=USER)
    history = [*USER, {"role": "assistant", "content": "edited"}, {"role": "user", "content": "go on"}]
    await client.chat.completions.create(model="m", messages=history)
    assert server.requests[1]["prompt"] == chat_tokenizer.encode_chat(history)
    assert len(client.recorder.trajectories) == 2


async def test_tool_calls_are_parsed_and_continued(replay, chat_tokenizer):
    server, url = replay
    tok = chat_tokenizer.tokenizer
    call = '<tool_call>{"name": "calc", "arguments": {"expr": "2+3"}}</tool_call>'
    server.script = [tok.encode(call, add_special_tokens=False) + [2], tok.encode("5", add_special_tokens=False) + [2]]
    client = make_client(url, chat_tokenizer, sampling=SamplingParams(max_tokens=200, temperature=0.7))
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    r1 = await client.chat.completions.create(model="m", messages=USER, tools=tools)
    c = r1.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    assert c.message.tool_calls[0].function.name == "calc"
    assert c.message.tool_calls[0].function.arguments == '{"expr": "2+3"}'
    msgs = [*USER, c.message, {"role": "tool", "tool_call_id": c.message.tool_calls[0].id, "content": "5"}]
    await client.chat.completions.create(model="m", messages=msgs, tools=tools)
    assert server.requests[1]["prompt"][: len(server.requests[0]["prompt"])] == server.requests[0]["prompt"]
    assert len(client.recorder.trajectories) == 1


async def test_refused_and_unknown_arguments(replay, chat_tokenizer):
    server, url = replay
    client = make_client(url, chat_tokenizer)
    with pytest.raises(TypeError, match="response_format"):
        await client.chat.completions.create(model="m", messages=USER, response_format={"type": "json_object"})
    with pytest.raises(ValueError, match="logit_bias"):
        await client.chat.completions.create(model="m", messages=USER, logit_bias={"5": 1.0})
    with pytest.raises(ValueError, match="presence_penalty"):
        await client.chat.completions.create(model="m", messages=USER, presence_penalty=0.5)
    with pytest.raises(ValueError, match="stream"):
        await client.chat.completions.create(model="m", messages=USER, stream=True)
    with pytest.raises(ValueError, match="max_tokens"):
        await client.chat.completions.create(model="m", messages=USER, max_tokens=0)
    with pytest.raises(ValueError, match="min_p"):
        await client.chat.completions.create(model="m", messages=USER, extra_body={"min_p": 0.1})
    r = await client.chat.completions.create(model="m", messages=USER, user="u", presence_penalty=0.0, seed=3,
                                             stop=["\n"], extra_body={"stop_token_ids": [5], "top_k": 3})
    assert len(r.choices) == 1
    sent = server.requests[-1]
    assert sent["stop"] == ["\n"] and sent["stop_token_ids"] == [5] and sent["seed"] == 3 and "top_k" not in sent


async def test_logprobs_in_openai_shape(replay, chat_tokenizer):
    _, url = replay
    client = make_client(url, chat_tokenizer, sampling=SamplingParams(max_tokens=6, temperature=0.7, seed=7))
    r = await client.chat.completions.create(model="m", messages=USER, logprobs=True)
    fx = load_fixture("processed_logprobs", "completions_tokens_in_logprobs")["response"]["choices"][0]
    assert [t.logprob for t in r.choices[0].logprobs.content] == fx["logprobs"]["token_logprobs"]


async def test_sync_facade_from_a_worker_thread(tiny_server, chat_tokenizer):
    _, url = tiny_server
    client = make_client(url, chat_tokenizer)
    loop = asyncio.get_running_loop()
    sync = SyncChatClient(client, loop)
    with pytest.raises(RuntimeError, match="event loop's thread"):
        sync.chat.completions.create(model="m", messages=USER)
    out: dict = {}

    def bundle_code():
        r = sync.chat.completions.create(model="m", messages=USER, n=2, max_tokens=4)
        out["n"] = len(r.choices)
        out["thread"] = threading.current_thread().name

    await asyncio.to_thread(bundle_code)
    assert out["n"] == 2 and len(client.recorder.samples) == 2
