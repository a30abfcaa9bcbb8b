"""`RolloutWorker`: default single-turn path, bundle rollouts (sync and async), errors, scoring."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from rft_runtime.data.task import Task
from rft_runtime.rewards import Sample, ScoreResult
from rft_runtime.rollout import (
    EvaluatorBundle,
    InferenceClient,
    InferenceHTTPError,
    InferenceUnavailableError,
    RetryPolicy,
    RolloutWorker,
    SamplingParams,
    episode_json,
)
from rft_runtime.types import Episode

from .conftest import OPEN_CLIENTS

FAST = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02)
TASK = Task(task_id="t7", prompt="what is 2 + 3?", ground_truth="5", domain="math")
SAMPLING = SamplingParams(max_tokens=8, temperature=0.7, seed=3)


pytestmark = pytest.mark.usefixtures("close_clients")


def worker(url, chat_tokenizer, **kw):
    inference = InferenceClient(url, "tiny", retry=FAST, rng=random.Random(0))
    OPEN_CLIENTS.append(inference)
    return RolloutWorker(inference, chat_tokenizer, **kw)


async def test_default_single_turn_path(real_server, chat_tokenizer):
    seen: list[Sample] = []

    async def scorer(sample, item):
        seen.append(sample)
        return 1.0 if item.ground_truth in sample["text"] else 0.25

    # granted version 2: both engines serve a newer one (a replica behind the grant would be retried)
    eps = await worker(real_server, chat_tokenizer, scorer=scorer).rollout_task(TASK, 4, SAMPLING, policy_version=2)
    assert [e.id for e in eps] == [f"t7:{i}" for i in range(4)]
    prompt = chat_tokenizer.encode_chat(TASK.chat_messages())
    for i, ep in enumerate(eps):
        [traj] = ep.trajectories
        [step] = traj.steps
        assert ep.rollout_idx == i and not ep.errors.any and ep.reward in (1.0, 0.25)
        assert traj.name == "default" and traj.reward == ep.reward == step.reward and step.done
        assert step.prompt_ids == prompt and 1 <= len(step.response_ids) <= 8
        assert len(step.logprobs) == len(step.response_ids) == len(step.response_mask)
        assert step.truncated == (step.finish_reason == "length") and ep.termination_reason == step.finish_reason
        assert step.metadata["seed"] == 3 + i and step.messages == TASK.chat_messages()
        assert step.policy_version in (3, 5)  # reported by the engine (test engine 3, builtin server 5)
        assert ep.metadata == {"domain": "math", "policy_version": 2}
        assert ep.metrics["num_samples"] == 1.0
        assert Episode.model_validate_json(json.dumps(episode_json(ep))) == ep  # JSON round trip
    assert sorted(s.id for s in seen) == [e.id for e in eps]
    # One sample type from the engine to the reward: the scorer gets the engine's own sample, with the
    # engine's logprobs and reported version, and the rewards' view is that same object.
    assert all(type(s) is Sample and len(s.logprobs) == len(s.completion_ids) > 0 for s in seen)
    assert all(s.policy_version in (3, 5) and s.text == s.messages[-1]["content"] for s in seen)
    assert Sample.from_any(seen[0]) is seen[0]
    assert len({tuple(e.trajectories[0].steps[0].response_ids) for e in eps}) > 1


def _continue_loop(turns: int):
    def rollout(task, client):  # synchronous bundle code, as written for openai.OpenAI()
        messages = task.chat_messages()
        for k in range(turns):
            r = client.chat.completions.create(model="x", messages=messages, max_tokens=5)
            messages = [*messages, r.choices[0].message.model_dump(), {"role": "user", "content": f"go on {k}"}]
        return {"metadata": {"turns": turns}, "metrics": {"turns": turns}, "output": "done"}

    return rollout


async def test_sync_multi_turn_bundle_on_real_engine(real_server, chat_tokenizer):
    scores = []

    def score(sample, item):
        scores.append(sample)
        return ScoreResult(reward=0.0, reason="wrong", metrics={"exact": 0.0})

    w = worker(real_server, chat_tokenizer, bundle=EvaluatorBundle("inline", rollout=_continue_loop(3), score=score))
    try:
        eps = await w.rollout_task(TASK, 2, SAMPLING, policy_version=1)
    finally:
        w.close()
    for ep in eps:
        assert not ep.errors.any and ep.reward == 0.0 and ep.reward_reason == "wrong"
        assert ep.metadata["turns"] == 3 and ep.metrics["turns"] == 3.0 and ep.metrics["exact"] == 0.0
        [traj] = ep.trajectories
        assert len(traj.steps) == 3
        merged = traj.merged()
        assert merged.prompt_ids == traj.steps[0].prompt_ids
        assert sum(merged.response_mask) == sum(len(s.response_ids) for s in traj.steps)
        for a, b in zip(traj.steps, traj.steps[1:]):  # each prompt extends the previous turn's ids
            assert b.prompt_ids[: len(a.prompt_ids) + len(a.response_ids)] == a.prompt_ids + a.response_ids
        assert merged.sampled_logprobs() == [lp for s in traj.steps for lp in s.logprobs]
        assert [m["role"] for m in traj.steps[2].messages] == ["user", "assistant", "user", "assistant", "user"]
    assert {s.output for s in scores} == {"done"} and len(scores[0].messages) == 6
    # the two rollouts drew different seeds (derived from the job seed and the rollout index)
    assert eps[0].trajectories[0].steps[0].metadata["seed"] != eps[1].trajectories[0].steps[0].metadata["seed"]


async def test_two_conversations_in_one_rollout_get_unique_names(tiny_server, chat_tokenizer):
    _, url = tiny_server

    async def rollout(task, client):
        await client.chat.completions.create(model="x", messages=task.chat_messages())
        await client.chat.completions.create(model="x", messages=[{"role": "user", "content": "other"}])
        await client.with_trajectory("judge").chat.completions.create(model="x", messages=[{"role": "user", "content": "j"}])
        return 1.0

    [ep] = await worker(url, chat_tokenizer, bundle=EvaluatorBundle("inline", rollout=rollout)).rollout_task(
        TASK, 1, SAMPLING, policy_version=0)
    assert [t.name for t in ep.trajectories] == ["default", "default#1", "judge"]
    assert ep.reward == 1.0 and all(t.reward == 1.0 for t in ep.trajectories)


async def test_bundle_errors_keep_the_episode_and_its_samples(tiny_server, chat_tokenizer):
    _, url = tiny_server

    async def failing(task, client):
        await client.chat.completions.create(model="x", messages=task.chat_messages())
        raise KeyError("env state")

    [ep] = await worker(url, chat_tokenizer, bundle=EvaluatorBundle("inline", rollout=failing)).rollout_task(
        TASK, 1, SAMPLING, policy_version=0)
    assert ep.errors.rollout_error and ep.errors.message.startswith("rollout_error: KeyError")
    assert ep.reward is None and len(ep.trajectories[0].steps) == 1 and ep.termination_reason == "error"

    async def slow(task, client):
        await client.chat.completions.create(model="x", messages=task.chat_messages())
        await asyncio.sleep(30)

    w = worker(url, chat_tokenizer, bundle=EvaluatorBundle("inline", rollout=slow), rollout_timeout_s=1.0)
    [ep] = await w.rollout_task(TASK, 1, SAMPLING, policy_version=0)
    assert ep.errors.timeout and ep.termination_reason == "timeout" and len(ep.trajectories[0].steps) == 1


@pytest.mark.parametrize(
    "returned, reward, error",
    [
        (0.75, 0.75, None),
        ({"reward": None, "metrics": {"x": 1}}, None, None),
        ({"reward": 1}, 1.0, None),
        ({"rewrd": 1}, None, "unknown key"),
        ({"metrics": {"x": "high"}}, None, "must be a finite number"),
        (float("nan"), None, "finite number"),
        ("text output", 0.5, None),  # passed to score as sample.output
    ],
)
async def test_rollout_return_values(tiny_server, chat_tokenizer, returned, reward, error):
    _, url = tiny_server

    async def rollout(task, client):
        await client.chat.completions.create(model="x", messages=task.chat_messages())
        return returned

    def score(sample, item):
        assert sample.output == "text output"
        return 0.5

    w = worker(url, chat_tokenizer, bundle=EvaluatorBundle("inline", rollout=rollout, score=score))
    [ep] = await w.rollout_task(TASK, 1, SAMPLING, policy_version=0)
    assert ep.reward == reward
    assert (not ep.errors.any) if error is None else (ep.errors.rollout_error and error in ep.errors.message)


@pytest.mark.parametrize(
    "score, reward, flag",
    [
        (lambda s, i: 1 / 0, None, "runtime_error"),
        (lambda s, i: "high", None, "parse_error"),
        (lambda s, i: ScoreResult.failure("timeout", "judge timed out"), 0.0, "timeout"),
        (lambda s, i: True, 1.0, None),
        (lambda s, i: {"reward": 0.5, "reason": "half"}, 0.5, None),
        (lambda s, i: None, None, None),
    ],
)
async def test_score_results_and_errors(tiny_server, chat_tokenizer, score, reward, flag):
    _, url = tiny_server
    eps = await worker(url, chat_tokenizer, scorer=score).rollout_task(TASK.to_dict(), 2, SAMPLING, policy_version=0)
    for ep in eps:  # a task dict works too
        assert ep.reward == reward
        assert (not ep.errors.any) if flag is None else getattr(ep.errors, flag)
        assert len(ep.trajectories[0].steps) == 1


async def test_no_samples_and_no_scorer(tiny_server, chat_tokenizer):
    _, url = tiny_server

    async def lazy(task, client):
        return None

    [ep] = await worker(url, chat_tokenizer, bundle=EvaluatorBundle("inline", rollout=lazy)).rollout_task(
        TASK, 1, SAMPLING, policy_version=0)
    assert ep.errors.message == "rollout_error: the rollout drew no samples" and ep.trajectories == []
    [ep] = await worker(url, chat_tokenizer).rollout_task(TASK, 1, SAMPLING, policy_version=0)
    assert ep.reward is None and not ep.errors.any and len(ep.trajectories) == 1  # unscored, not an error


async def test_inference_failure_propagates(chat_tokenizer):
    w = worker("http://127.0.0.1:9", chat_tokenizer, scorer=lambda s, i: 1.0)
    with pytest.raises(InferenceUnavailableError):
        await w.rollout_task(TASK, 2, SAMPLING, policy_version=0)

    async def rollout(task, client):
        await client.chat.completions.create(model="x", messages=task.chat_messages())

    w = worker("http://127.0.0.1:9", chat_tokenizer, bundle=EvaluatorBundle("inline", rollout=rollout))
    with pytest.raises(InferenceUnavailableError):
        await w.rollout_task(TASK, 1, SAMPLING, policy_version=0)


async def test_refused_request_is_an_episode_error_but_config_errors_propagate(replay, chat_tokenizer):
    server, url = replay
    server.faults = [400]  # e.g. vLLM's context-overflow 400
    eps = await worker(url, chat_tokenizer).rollout_task(TASK, 2, SAMPLING, policy_version=0)
    assert [e.id for e in eps] == ["t7:0", "t7:1"]
    assert all(e.errors.message.startswith("request_error:") and "400" in e.errors.message for e in eps)
    assert all(e.reward is None for e in eps)

    async def two_turns(task, client):
        r = await client.chat.completions.create(model="x", messages=task.chat_messages())
        await client.chat.completions.create(model="x", messages=[*task.chat_messages(), r.choices[0].message,
                                                                   {"role": "user", "content": "more"}])

    server.faults = [lambda body: None, 400]
    w = worker(url, chat_tokenizer, bundle=EvaluatorBundle("inline", rollout=two_turns))
    [ep] = await w.rollout_task(TASK, 1, SAMPLING, policy_version=0)
    assert ep.errors.message.startswith("request_error:") and len(ep.trajectories[0].steps) == 1

    server.faults = [404]
    with pytest.raises(InferenceHTTPError, match="404"):
        await worker(url, chat_tokenizer).rollout_task(TASK, 1, SAMPLING, policy_version=0)


async def test_max_turns_ends_the_episode_with_its_termination_reason(real_server, chat_tokenizer):
    """rollout.maxTurns: turn maxTurns+1 is not sampled; the episode ends as `max_turns` and is scored."""
    scored = []

    def score(sample, item):
        scored.append(sample)
        return 1.0

    w = worker(real_server, chat_tokenizer, bundle=EvaluatorBundle("inline", rollout=_continue_loop(5), score=score),
               max_turns=2)
    try:
        eps = await w.rollout_task(TASK, 2, SAMPLING, policy_version=1)
    finally:
        w.close()
    for ep in eps:
        assert ep.termination_reason == "max_turns" and not ep.errors.any and ep.reward == 1.0
        assert len(ep.trajectories[0].steps) == 2
    assert len(scored) == 2


async def test_prompt_longer_than_max_prompt_tokens_is_a_per_task_error(real_server, chat_tokenizer):
    """rollout.maxPromptTokens: nothing is sampled; every episode of the task says why (not retried)."""
    w = worker(real_server, chat_tokenizer, max_prompt_tokens=5)
    eps = await w.rollout_task(TASK, 3, SAMPLING, policy_version=1)
    assert len(eps) == 3
    for ep in eps:
        assert ep.errors.rollout_error and ep.reward is None and not ep.trajectories
        assert "rollout.maxPromptTokens (5)" in ep.errors.message and "prompt_too_long" in ep.errors.message
    bundle = worker(real_server, chat_tokenizer, max_prompt_tokens=5,
                    bundle=EvaluatorBundle("inline", rollout=_continue_loop(1)))
    try:
        [ep] = await bundle.rollout_task(TASK, 1, SAMPLING, policy_version=1)
    finally:
        bundle.close()
    assert "prompt_too_long" in ep.errors.message
