"""The reward contract's types: Sample/Item conversion, ScoreResult checks, result normalisation."""

from __future__ import annotations

import math

import pytest

from rft_runtime.rewards import BUILTINS, Item, Registry, Sample, ScoreResult, UnknownEvaluatorError, normalise_result


def test_sample_from_dict_takes_text_from_final_assistant_message() -> None:
    s = Sample.from_any({
        "messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": [{"type": "text", "text": "4"}]}],
        "prompt_ids": [1, 2], "response_ids": [3], "finish_reason": "stop", "truncated": False,
    })
    assert s.text == "4"
    assert s.completion_ids == [3]
    assert s.prompt_text == "2+2?"
    assert s["finish_reason"] == "stop" and s.get("missing", 5) == 5


def test_sample_from_string_and_bad_fields() -> None:
    s = Sample.from_any("hello")
    assert s.text == "hello" and s.messages[-1] == {"role": "assistant", "content": "hello"}
    with pytest.raises(ValueError, match="prompt_ids"):
        Sample.from_any({"text": "x", "prompt_ids": ["a"]})
    with pytest.raises(ValueError, match="messages"):
        Sample.from_any({"messages": "nope"})


def test_item_from_task_like_object() -> None:
    class TaskLike:
        task_id = "t1"
        prompt = "What is 6*7?"
        messages = None
        ground_truth = "42"
        domain = "math"
        metadata = {"source": "unit"}

    item = Item.from_any(TaskLike())
    assert (item.ground_truth, item.domain, item.task_id) == ("42", "math", "t1")
    assert item.messages == [{"role": "user", "content": "What is 6*7?"}]
    assert Item.from_any(None).ground_truth is None


@pytest.mark.parametrize("value, reward", [(None, None), (True, 1.0), (False, 0.0), (3, 3.0), (0.25, 0.25)])
def test_normalise_plain_values(value: object, reward: float | None) -> None:
    assert normalise_result(value).reward == reward


def test_normalise_dicts_and_objects() -> None:
    r = normalise_result({"reward": 0.5, "reason": "half", "metrics": {"a": 1, "b": True, "skip": "x"}})
    assert (r.reward, r.reason, r.metrics) == (0.5, "half", {"a": 1.0, "b": 1.0})
    assert normalise_result({"score": 1}).reward == 1.0

    class EvaluateResult:  # Eval Protocol's shape
        score = 0.75
        reason = "ok"
        metrics = {"format": {"score": 1.0}}

    r = normalise_result(EvaluateResult())
    assert (r.reward, r.metrics) == (0.75, {"format": 1.0})


@pytest.mark.parametrize("bad", [float("nan"), math.inf, "1.0", [1.0], {"reason": "no reward"}])
def test_normalise_refuses_bad_values(bad: object) -> None:
    with pytest.raises(ValueError):
        normalise_result(bad)


def test_score_result_validation() -> None:
    with pytest.raises(ValueError, match="error"):
        ScoreResult(0.0, error="crashed")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="finite"):
        ScoreResult(float("nan"))
    assert ScoreResult(1, metrics={"x": 2}).to_dict() == {"reward": 1.0, "reason": "", "metrics": {"x": 2.0}, "error": None}


def test_builtin_registry_keys_equal_the_crd_enum() -> None:
    from rft_api.constants import BUILTIN_EVALUATORS

    assert BUILTINS.names() == sorted(BUILTIN_EVALUATORS)


def test_registry_refuses_duplicates_and_lists_unknown_names() -> None:
    with pytest.raises(ValueError, match="already registered"):
        BUILTINS.register("math", lambda cfg: None)  # type: ignore[arg-type, return-value]
    with pytest.raises(UnknownEvaluatorError) as info:
        BUILTINS.get("maths")
    assert "maths" in str(info.value) and "string_check" in str(info.value) and "code_sandbox" in str(info.value)
    reg: Registry[int] = Registry("thing")
    reg.register("a", 1)
    assert reg.get("a") == 1 and "a" in reg and "b" not in reg
