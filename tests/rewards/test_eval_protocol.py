"""Eval Protocol evaluators run unchanged as the reward, with the real ``eval-protocol`` package.

The evaluation test of ``examples/07-eval-protocol.yaml`` (written as Eval Protocol's docs show, with
its own rollout processor and completion params) is loaded from the example and scored through the
rewards service; groupwise tests and ``@reward_function`` (pointwise and batch) are checked the same
way, and so are the rows the evaluator sees (``EvaluationRow.model_validate`` on their JSON) and the
errors a user can make.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from rft_runtime.rewards import ConfigError, Item, Sample
from rft_runtime.rewards.config import from_spec
from rft_runtime.rewards.eval_protocol import EvalProtocolEvaluator, to_row, training_extra
from rft_runtime.rewards.factory import build_composite
from rft_runtime.rewards.service import RewardService

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "07-eval-protocol.yaml"

GROUPWISE = textwrap.dedent('''
    from eval_protocol.models import EvaluateResult, EvaluationRow
    from eval_protocol.pytest import NoOpRolloutProcessor, evaluation_test

    CALLS = []


    @evaluation_test(input_messages=[[[{"role": "user", "content": "hi"}]]], rollout_processor=NoOpRolloutProcessor(),
                     mode="groupwise")
    def test_rank(rows: list[EvaluationRow]) -> list[EvaluationRow]:
        """1 for the shortest reply of the group, 0 for the others: needs the whole group."""
        CALLS.append(len(rows))
        lengths = [len(r.messages[-1].content or "") for r in rows]
        for row, n in zip(rows, lengths):
            row.evaluation_result = EvaluateResult(score=float(n == min(lengths)), reason=f"length {n}")
        return rows
''')

REWARD_FUNCTIONS = textwrap.dedent('''
    from typing import List

    from eval_protocol.models import EvaluateResult, Message, MetricResult
    from eval_protocol.typed_interface import reward_function


    @reward_function
    def exact(messages: List[Message], ground_truth=None, **kwargs) -> EvaluateResult:
        said = (messages[-1].content or "").strip()
        ok = said == str(ground_truth)
        return EvaluateResult(score=float(ok), reason=f"said {said!r}",
                              metrics={"length": MetricResult(score=float(len(said)), reason="chars")})


    @reward_function(mode="batch")
    def first_right(rollouts_messages, ground_truth=None, **kwargs):
        return [EvaluateResult(score=float(i == 0), reason=f"rollout {i}") for i, _ in enumerate(rollouts_messages)]


    @reward_function
    def unsure(messages, **kwargs):
        return EvaluateResult(score=0.25, is_score_valid=False, reason="could not parse")


    @reward_function
    def broken(messages, **kwargs):
        raise RuntimeError("evaluator crashed")
''')


def example_file(tmp_path: Path) -> Path:
    """The example's evaluation test, as the ConfigMap holds it."""
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    data = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    path = tmp_path / "test_arithmetic.py"
    path.write_text(data["test_arithmetic.py"])
    return path


def service(spec: dict, files: dict[int, str]) -> RewardService:
    return RewardService(build_composite(from_spec(spec, files=files)))


def sample(text: str, sid: str = "t1:0") -> Sample:
    return Sample(text=text, id=sid, prompt_ids=[1, 2, 3], completion_ids=[4, 5], logprobs=[-0.5, -0.25],
                  finish_reason="stop", messages=[{"role": "user", "content": "What is 12 + 30?"},
                                                  {"role": "assistant", "content": text}])


ITEM = Item(ground_truth="42", task_id="t1", domain="arith", metadata={"level": 1})


async def test_the_examples_evaluation_test_scores_samples_unchanged(tmp_path):
    path = example_file(tmp_path)
    svc = service({"evalProtocol": {"configMapKeyRef": {"name": "arithmetic-eval", "key": "test_arithmetic.py"},
                                    "test": "test_arithmetic"}}, {0: str(path)})
    exact, close, none = [await svc.score(sample(t), ITEM) for t in ("42", "40", "no idea")]
    assert exact.reward == 1.0 and exact.reason == "answered 42, expected 42" and exact.error is None
    assert exact.metrics["test_arithmetic"] == 1.0 and exact.metrics["test_arithmetic/closeness"] == 1.0
    assert close.reward == 0.0 and close.metrics["test_arithmetic/closeness"] == pytest.approx(1 - 2 / 42)
    assert none.reward == 0.0 and none.reason == "no number in the reply"
    await svc.aclose()


async def test_the_test_is_found_without_its_name_when_the_file_has_one(tmp_path):
    path = example_file(tmp_path)
    ev = EvalProtocolEvaluator.load(path=str(path))
    assert (ev.kind, ev.mode, ev.grouped) == ("evaluation_test", "pointwise", False)
    assert ev.source.endswith(":test_arithmetic")


def test_the_row_the_evaluator_sees_is_a_valid_evaluation_row():
    from eval_protocol.models import EvaluationRow

    row = to_row(sample("42"), ITEM)
    again = EvaluationRow.model_validate(row.model_dump(mode="json"))
    assert [m.role for m in again.messages] == ["user", "assistant"] and again.messages[-1].content == "42"
    assert again.ground_truth == "42"
    assert again.input_metadata.row_id == "t1"
    assert again.input_metadata.dataset_info == {"level": 1, "domain": "arith"}
    assert again.execution_metadata.rollout_id == "t1:0"
    assert again.execution_metadata.extra == {
        "prompt_ids": [1, 2, 3], "completion_ids": [[4, 5]], "inference_logprobs": [[-0.5, -0.25]],
        "completions_text": ["42"], "truncated": [False], "finish_reasons": ["stop"]}


def test_training_extra_has_the_processor_shapes():
    extra = training_extra([7, 8], [Sample(text="a", completion_ids=[1], logprobs=[-1.0], finish_reason="stop"),
                                    Sample(text="bc", completion_ids=[2, 3], logprobs=[-0.5, -0.1],
                                           finish_reason="length", truncated=True)])
    assert extra == {"prompt_ids": [7, 8], "completion_ids": [[1], [2, 3]], "inference_logprobs": [[-1.0], [-0.5, -0.1]],
                     "completions_text": ["a", "bc"], "truncated": [False, True], "finish_reasons": ["stop", "length"]}


async def test_a_groupwise_test_sees_the_whole_group_in_one_call(tmp_path):
    path = tmp_path / "rank.py"
    path.write_text(GROUPWISE)
    svc = service({"evalProtocol": {"configMapKeyRef": {"name": "x", "key": "rank.py"}}}, {0: str(path)})
    results = await svc.score_group([sample(t, f"t1:{i}") for i, t in enumerate(["4", "42", "420"])], ITEM)
    assert [r.reward for r in results] == [1.0, 0.0, 0.0]
    assert [r.reason for r in results] == ["length 1", "length 2", "length 3"]
    import sys

    module = next(m for name, m in sys.modules.items() if getattr(m, "__file__", None) == str(path))
    assert module.CALLS == [3]
    await svc.aclose()


async def test_reward_functions_pointwise_and_batch(tmp_path):
    path = tmp_path / "rf.py"
    path.write_text(REWARD_FUNCTIONS)
    ref = {"name": "x", "key": "rf.py"}
    svc = service({"evaluators": [{"name": "exact", "evalProtocol": {"configMapKeyRef": ref, "test": "exact"}},
                                  {"name": "batch", "weight": 0, "evalProtocol": {"configMapKeyRef": ref, "test": "first_right"}}]},
                  {0: str(path), 1: str(path)})
    right, wrong = await svc.score_group([sample("42", "t1:0"), sample("41", "t1:1")], ITEM)
    assert right.reward == 1.0 and right.metrics["exact/length"] == 2.0 and right.metrics["batch"] == 1.0
    assert wrong.reward == 0.0 and wrong.metrics["batch"] == 0.0
    alone = await svc.score(sample("42"), ITEM)  # a batch function scores a group of one
    assert alone.metrics["batch"] == 1.0
    await svc.aclose()


async def test_an_invalid_score_is_flagged_and_a_crash_follows_on_error(tmp_path):
    path = tmp_path / "rf.py"
    path.write_text(REWARD_FUNCTIONS)
    ref = {"name": "x", "key": "rf.py"}
    unsure = await service({"evalProtocol": {"configMapKeyRef": ref, "test": "unsure"}}, {0: str(path)}).score(sample("1"), ITEM)
    assert unsure.reward == 0.25 and unsure.error == "parse_error"
    svc = service({"evalProtocol": {"configMapKeyRef": ref, "test": "broken"}, "onError": "exclude"}, {0: str(path)})
    crashed = await svc.score(sample("1"), ITEM)
    assert crashed.reward is None and crashed.error == "runtime_error" and "evaluator crashed" in crashed.reason
    group = await svc.score_group([sample("1"), sample("2")], ITEM)
    assert [r.error for r in group] == ["runtime_error", "runtime_error"]


def test_a_file_with_several_functions_needs_test_and_the_error_lists_them(tmp_path):
    path = tmp_path / "rf.py"
    path.write_text(REWARD_FUNCTIONS)
    with pytest.raises(ConfigError, match=r"set evalProtocol.test .* 4 .*\(broken, exact, first_right, unsure\)"):
        EvalProtocolEvaluator.load(path=str(path))


def test_a_function_that_is_not_decorated_is_refused_by_name(tmp_path):
    path = tmp_path / "plain.py"
    path.write_text("def score(sample, item):\n    return 1.0\n")
    with pytest.raises(ConfigError, match=r"plain.py:score is not an Eval Protocol @evaluation_test or @reward_function"):
        EvalProtocolEvaluator.load(path=str(path), test="score")
    with pytest.raises(ConfigError, match=r"has no attribute 'missing'"):
        EvalProtocolEvaluator.load(path=str(path), test="missing")


def test_an_all_mode_test_is_refused(tmp_path):
    path = tmp_path / "all.py"
    path.write_text(GROUPWISE.replace('mode="groupwise"', 'mode="all"'))
    with pytest.raises(ConfigError, match=r"mode 'all' cannot score training samples"):
        EvalProtocolEvaluator.load(path=str(path))


def test_the_spec_needs_exactly_one_source():
    with pytest.raises(ConfigError, match=r"evalProtocol needs exactly one of configMapKeyRef .* or entrypoint"):
        from_spec({"evalProtocol": {"test": "t"}})
    with pytest.raises(ConfigError, match=r"exactly one of builtin, bundle, file or evalProtocol"):
        from_spec({"evaluators": [{"builtin": "math", "evalProtocol": {"entrypoint": "m"}}]})
