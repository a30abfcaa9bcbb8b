"""Evaluator bundle loading, and the worked calculator example run against real servers."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path

import pytest

from rft_runtime.data.task import Task
from rft_runtime.rollout import (
    BundleError,
    InferenceClient,
    RetryPolicy,
    RolloutWorker,
    SamplingParams,
    load_bundle,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "bundles" / "calculator.py"
FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02)

MODULE = textwrap.dedent(
    """
    def rollout(task, client):
        return 1.0

    def score(sample, item):
        return 0.5

    class Bundle:
        @staticmethod
        async def rollout(task, client):
            return None

        @staticmethod
        def score(sample, item):
            return 1.0

    def bad(task):
        return None

    NOT_A_BUNDLE = 3
    """
)


def test_load_example_file():
    b = load_bundle(str(EXAMPLE))
    assert b.rollout.__name__ == "rollout" and b.rollout_is_async
    assert b.score.__name__ == "score" and not b.score_is_async
    assert load_bundle(str(EXAMPLE)).rollout is b.rollout  # loaded once
    calc = b.rollout.__globals__["evaluate"]
    assert calc("2 + 3*4") == "14" and calc("7/2") == "3.5"
    assert calc("__import__('os').system('id')").startswith("error")
    assert calc("1/0").startswith("error")


def test_module_reference_forms(tmp_path, monkeypatch):
    (tmp_path / "rft_test_bundle_mod.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    whole = load_bundle("rft_test_bundle_mod")
    assert whole.rollout.__name__ == "rollout" and whole.score.__name__ == "score"
    fn = load_bundle("rft_test_bundle_mod:rollout")
    assert fn.rollout.__name__ == "rollout" and fn.score is None
    obj = load_bundle("rft_test_bundle_mod:Bundle")
    assert obj.rollout_is_async and obj.score(None, None) == 1.0
    path_attr = load_bundle(f"{tmp_path / 'rft_test_bundle_mod.py'}:Bundle")
    assert path_attr.rollout_is_async


@pytest.mark.parametrize(
    "ref, match",
    [
        ("rft_test_bundle_mod:bad", r"rollout must accept two positional arguments rollout\(task, client\)"),
        ("rft_test_bundle_mod:missing", "has no attribute 'missing'"),
        ("rft_test_bundle_mod:NOT_A_BUNDLE", "neither a function nor an object"),
        ("no_such_module_xyz", "cannot import module"),
        ("/nonexistent/bundle.py", "does not exist"),
        ("", "non-empty"),
    ],
)
def test_bad_references(tmp_path, monkeypatch, ref, match):
    (tmp_path / "rft_test_bundle_mod.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BundleError, match=match):
        load_bundle(ref)


def test_file_without_py_suffix(tmp_path):
    (tmp_path / "bundle").write_text(MODULE)  # a ConfigMap key mounted as a file
    b = load_bundle(f"{tmp_path / 'bundle'}:Bundle")
    assert b.rollout_is_async and b.score(None, None) == 1.0


def test_bad_files(tmp_path):
    (tmp_path / "broken.py").write_text("def rollout(task, client):\n  return (\n")
    with pytest.raises(BundleError, match="SyntaxError"):
        load_bundle(str(tmp_path / "broken.py"))
    (tmp_path / "empty.py").write_text("X = 1\n")
    with pytest.raises(BundleError, match="neither rollout"):
        load_bundle(str(tmp_path / "empty.py"))


def _task(answer="5") -> Task:
    return Task(task_id="calc-1", prompt="what is 2 + 3?", ground_truth=answer)


async def test_calculator_bundle_scripted_multi_turn(replay, chat_tokenizer):
    """A deterministic two-turn episode (scripted engine replies) through the real HTTP path."""
    server, url = replay
    tok = chat_tokenizer.tokenizer
    enc = lambda s: tok.encode(s, add_special_tokens=False) + [2]  # noqa: E731
    server.script = [enc("<calc>2+3</calc>"), enc("ANSWER: 5")]
    async with InferenceClient(url, "tiny", retry=FAST, rng=random.Random(0)) as inference:
        worker = RolloutWorker(inference, chat_tokenizer, bundle=load_bundle(str(EXAMPLE)))
        [ep] = await worker.rollout_task(_task(), 1, SamplingParams(max_tokens=48, temperature=0.7), policy_version=7)
    assert ep.id == "calc-1:0" and not ep.errors.any and ep.reward == 1.0
    assert ep.metrics["calculator_calls"] == 1 and ep.metrics["num_samples"] == 2
    [traj] = ep.trajectories
    s1, s2 = traj.steps
    assert s1.response_ids == enc("<calc>2+3</calc>") and s2.response_ids == enc("ANSWER: 5")
    assert s1.policy_version == 7 and s2.done and s2.reward == 1.0 and s1.reward is None
    merged = traj.merged()
    prompt, resp, mask = merged.prompt_ids, merged.response_ids, merged.response_mask
    tool_turn = chat_tokenizer.close_assistant(s1.response_ids) + chat_tokenizer.message_delta([{"role": "tool", "content": "5"}])
    assert resp == s1.response_ids + tool_turn + s2.response_ids
    assert mask == [1] * len(s1.response_ids) + [0] * len(tool_turn) + [1] * len(s2.response_ids)
    assert server.requests[1]["prompt"] == prompt + s1.response_ids + tool_turn


async def test_calculator_bundle_against_real_engine(real_server, chat_tokenizer):
    async with InferenceClient(real_server, "tiny", retry=FAST, rng=random.Random(0)) as inference:
        worker = RolloutWorker(inference, chat_tokenizer, bundle=load_bundle(str(EXAMPLE)))
        eps = await worker.rollout_task(_task(), 2, SamplingParams(max_tokens=16, temperature=0.7, seed=11), policy_version=0)
    assert [e.id for e in eps] == ["calc-1:0", "calc-1:1"]
    for ep in eps:
        assert not ep.errors.any and ep.reward in (0.0, 1.0)
        for traj in ep.trajectories:
            for st in traj.steps:
                assert len(st.response_ids) == len(st.logprobs) >= 1 and all(lp <= 0 for lp in st.logprobs)
                assert st.prompt_ids[:3] == chat_tokenizer.encode_chat([{"role": "system", "content": "x"}])[:3]
    assert eps[0].trajectories[0].steps[0].response_ids != eps[1].trajectories[0].steps[0].response_ids
