"""Token-contract types: JSON round trips, length checks, grouping, multi-turn merge."""

from __future__ import annotations

import json
import random

import pytest
from pydantic import ValidationError

from rft_runtime.types import (
    Episode,
    ErrorFlags,
    Step,
    Trajectory,
    episode_id,
    group_key,
    parse_episode_id,
)


def make_step(n: int = 4, *, seed: int = 0, version: int = 1, **kw) -> Step:
    rng = random.Random(seed)
    fields = dict(
        prompt_ids=[1] + [rng.randrange(3, 259) for _ in range(5)],
        response_ids=[rng.randrange(3, 259) for _ in range(n)],
        logprobs=[-rng.random() * 5 for _ in range(n)],
        policy_version=version,
        finish_reason="stop",
        response_text="42",
    )
    fields.update(kw)
    return Step(**fields)


def make_episode(task_id: str = "arith-7", idx: int = 0, reward: float | None = 1.0, **kw) -> Episode:
    return Episode(task_id=task_id, rollout_idx=idx,
                   trajectories=[Trajectory(steps=[make_step(seed=idx)], reward=reward)], **kw)


# ---------------------------------------------------------------- JSON round trips


def test_step_json_round_trip_is_exact_for_awkward_floats():
    rng = random.Random(3)
    lps = [-rng.random() * 20 for _ in range(500)] + [-1e-300, -5e-324, -0.1, -2.0 / 3.0, 0.0]
    step = Step(prompt_ids=[1, 2], response_ids=list(range(3, 3 + len(lps))), logprobs=lps, policy_version=0,
                metadata={"k": [1, "x", None, {"y": 2.5}]}, messages=[{"role": "user", "content": "héllo"}])
    back = Step.from_json(step.to_json())
    assert back == step
    assert back.logprobs == lps  # bit-exact floats
    assert json.loads(step.to_json())["response_mask"] == [1] * len(lps)


def test_episode_json_round_trip_with_everything_set():
    ep = Episode(
        task_id="gsm:12", rollout_idx=3,
        trajectories=[
            Trajectory(name="solver", steps=[make_step(seed=1), make_step(seed=2, version=2)], reward=0.5,
                       metadata={"turns": 2}),
            Trajectory(name="judge", steps=[make_step(seed=3)], reward=None),
        ],
        is_correct=False, reward_reason="wrong", metrics={"format": 1.0, "len": 3},
        termination_reason="max_turns", errors=ErrorFlags(timeout=True, message="slow"),
        metadata={"lease": "abc"},
    )
    text = ep.to_json()
    back = Episode.from_json(text)
    assert back == ep
    assert back.to_json() == text
    assert back.id == "gsm:12:3"
    assert back.errors.any and back.metrics == {"format": 1.0, "len": 3.0}


# ---------------------------------------------------------------- length checks


@pytest.mark.parametrize(
    "override, message",
    [
        ({"logprobs": [-0.5]}, "logprobs has 1 entries but response_ids has 4 tokens"),
        ({"logprobs": [-0.5] * 5}, "logprobs has 5 entries but response_ids has 4 tokens"),
        ({"response_mask": [1, 1, 1]}, "response_mask has 3 entries but response_ids has 4 tokens"),
        ({"response_mask": [1, 2, 1, 1]}, "response_mask values must be 0 or 1"),
        ({"response_mask": [1, 0, 3, 2]}, "must be 0 or 1, got 3"),  # the first bad value named
        ({"response_mask": [1, 0, 1, 1]}, "logprobs[1] = "),  # mask-0 token with a non-zero logprob
        ({"logprobs": [-0.1, 0.3, -0.1, -0.1]}, "logprobs must be finite and <= 0"),
        ({"logprobs": [-0.1, float("nan"), -0.1, -0.1]}, "logprobs must be finite and <= 0"),
        ({"logprobs": [-0.1, float("-inf"), -0.1, -0.1]}, "logprobs must be finite and <= 0"),
        ({"logprobs": [-0.1, float("inf"), -0.1, float("-inf")]}, "logprobs[1] = inf"),  # a NaN sum
        ({"logprobs": [-0.1, -0.1, float("nan"), 0.5]}, "logprobs[2] = nan"),
        ({"prompt_ids": []}, "prompt_ids must not be empty"),
        ({"prompt_ids": [1, -3]}, "prompt_ids must be non-negative"),
        ({"response_ids": [5, 6, -1, 7]}, "response_ids must be non-negative"),
        ({"policy_version": -1}, "policy_version must be >= 0"),
    ],
)
def test_step_checks_raise_with_clear_message(override, message):
    with pytest.raises(ValidationError) as err:
        make_step(4, **override)
    assert message in str(err.value)


def test_step_rejects_non_integer_token_ids():
    with pytest.raises(ValidationError, match="response_ids"):
        make_step(2, response_ids=[5, "6"])
    with pytest.raises(ValidationError, match="response_mask"):
        make_step(2, response_mask=[True, 1])


def test_finite_logprobs_whose_sum_overflows_are_accepted():
    """The check adds the log-probs up to find a bad one at C speed; a sum that overflows while every
    term is finite sends it to the term-by-term walk, which finds none."""
    step = make_step(4, logprobs=[-1e308, -1e308, -0.1, -0.1])
    assert step.logprobs[0] == -1e308


def test_mask_zero_tokens_carry_zero_logprob_and_count_as_not_sampled():
    step = make_step(4, response_mask=[1, 0, 0, 1], logprobs=[-0.2, 0.0, 0.0, -1.5])
    assert step.num_sampled_tokens == 2
    assert step.sampled_logprobs() == [-0.2, -1.5]
    assert step.full_ids == step.prompt_ids + step.response_ids


def test_episode_id_checks_and_group_key():
    ep = make_episode("t:with:colons", 5)
    assert ep.id == episode_id("t:with:colons", 5) == "t:with:colons:5"
    assert parse_episode_id(ep.id) == ("t:with:colons", 5)
    assert group_key(ep, ep.trajectories[0]) == "t:with:colons:default"
    with pytest.raises(ValidationError, match="does not match"):
        Episode(id="t:4", task_id="t", rollout_idx=5)
    assert Episode(id="t:with:colons:3").rollout_idx == 3  # rLLM writes only the id
    with pytest.raises(ValidationError, match="rollout_idx"):
        Episode(task_id="t", rollout_idx=-1)
    with pytest.raises(ValueError, match="not of the form"):
        parse_episode_id("no-index")


def test_group_key_is_shared_by_rollouts_of_a_task_and_split_by_trajectory_name():
    a, b = make_episode("task", 0), make_episode("task", 1)
    solver = Trajectory(name="solver", steps=[make_step()])
    assert group_key(a, a.trajectories[0]) == group_key(b, b.trajectories[0])
    assert group_key(a, solver) != group_key(a, a.trajectories[0])


# ---------------------------------------------------------------- multi-turn merge


def test_merged_trajectory_appends_environment_tokens_with_mask_zero():
    s1 = Step(prompt_ids=[1, 10, 11], response_ids=[20, 21], logprobs=[-0.1, -0.2], policy_version=3,
              response_text="call")
    s2 = Step(prompt_ids=[1, 10, 11, 20, 21, 30, 31, 32], response_ids=[40], logprobs=[-0.3], policy_version=4,
              response_text="done", finish_reason="stop", done=True)
    merged = Trajectory(steps=[s1, s2], reward=1.0).merged()
    assert merged.prompt_ids == [1, 10, 11]
    assert merged.response_ids == [20, 21, 30, 31, 32, 40]
    assert merged.response_mask == [1, 1, 0, 0, 0, 1]
    assert merged.logprobs == [-0.1, -0.2, 0.0, 0.0, 0.0, -0.3]
    assert merged.policy_version == 3 and merged.metadata["policy_versions"] == [3, 4]
    assert merged.reward == 1.0 and merged.done and merged.response_text == "done"


def test_merge_refuses_a_step_that_retokenised_the_history():
    s1 = Step(prompt_ids=[1, 10], response_ids=[20, 21], logprobs=[-0.1, -0.2], policy_version=0)
    s2 = Step(prompt_ids=[1, 10, 20, 99, 30], response_ids=[40], logprobs=[-0.3], policy_version=0)
    with pytest.raises(ValueError, match=r"steps\[1\].prompt_ids does not extend .* position 3"):
        Trajectory(steps=[s1, s2]).merged()


# ---------------------------------------------------------------- rLLM's JSON


def _rllm_step(prompt: list[int], response: list[int], version: int | None) -> dict:
    """A step as rLLM's ``Step.to_dict()`` writes it (every key it writes)."""
    return {"prompt_ids": prompt, "response_ids": response, "logprobs": [-0.5] * len(response),
            "chat_completions": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
            "observation": {"board": [1, 2]}, "thought": "add", "action": {"answer": 4}, "model_response": "4",
            "model_output": None, "info": {"tool": "calc"}, "reward": 1.0, "done": True, "mc_return": 0.9,
            "advantage": [0.25] * len(response), "weight_version": version}


def _rllm_episode() -> dict:
    """A two-agent episode as rLLM's ``Episode.to_dict()`` writes it (solver twice, then a judge)."""
    solver = [{"uid": f"u{i}", "name": "solver", "task": {"q": "2+2"}, "reward": float(i),
               "steps": [_rllm_step([1, 2, 3], [4, 5], 7)], "info": {"attempt": i}} for i in range(2)]
    judge = {"uid": "u9", "name": "judge", "task": {"q": "2+2"}, "reward": 0.5,
             "steps": [_rllm_step([1, 9], [6], 7)], "info": {}}
    return {"id": "task-3:1", "task": {"q": "2+2"}, "termination_reason": "max_turns_exceeded", "is_correct": True,
            "trajectories": [*solver, judge], "metrics": {"solver_acc": 0.5}, "info": {"error": None}}


def _contains(big: object, small: object, where: str = "") -> None:
    """Every key and value of ``small`` is in ``big`` (what rLLM wrote survives, unchanged)."""
    if isinstance(small, dict):
        assert isinstance(big, dict), where
        for k, v in small.items():
            assert k in big, f"{where}.{k} lost"
            _contains(big[k], v, f"{where}.{k}")
    elif isinstance(small, list):
        assert isinstance(big, list) and len(big) == len(small), where
        for i, (b, s_) in enumerate(zip(big, small)):
            _contains(b, s_, f"{where}[{i}]")
    else:
        assert big == small, f"{where}: {big!r} != {small!r}"


def test_rllm_episode_json_round_trips_without_loss():
    written = _rllm_episode()
    ep = Episode.model_validate(written)
    assert (ep.task_id, ep.rollout_idx) == ("task-3", 1)
    assert ep.trajectories[0].steps[0].policy_version == 7  # rLLM's weight_version is our policy version
    back = json.loads(ep.to_json())
    _contains(back, written)
    assert Episode.from_json(ep.to_json()) == ep


def test_two_named_agents_are_grouped_by_task_and_trajectory_name():
    from rft_runtime.trainer.batch import sequences_from_episode

    seqs = sequences_from_episode(Episode.model_validate(_rllm_episode()))
    assert [s.group for s in seqs] == ["task-3:solver", "task-3:solver", "task-3:judge"]
    assert [s.reward for s in seqs] == [0.0, 1.0, 0.5]
