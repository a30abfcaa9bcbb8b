"""Builtin ``math``: answer extraction and equivalence, including the guarded sympy path."""

from __future__ import annotations

import os

import pytest

from rft_runtime.rewards import ConfigError, Item, Sample
from rft_runtime.rewards.answers import (
    SymbolicChecker,
    answers_equal,
    extract_answer,
    find_boxed,
    ground_truth_answers,
    parse_number,
)
from rft_runtime.rewards.answers.latex import to_sympy_syntax
from rft_runtime.rewards.builtins import MathEvaluator


def test_find_boxed_keeps_nested_braces() -> None:
    text = r"first \boxed{1} then \boxed{\frac{1}{\sqrt{2}}} and \fbox{x^{2}}"
    assert find_boxed(text) == ["1", r"\frac{1}{\sqrt{2}}", "x^{2}"]


@pytest.mark.parametrize("text, answer, method", [
    (r"so it is \boxed{\dfrac{3}{4}}. #### 7", r"\dfrac{3}{4}", "boxed"),
    ("Natalia sold 48 clips...\n#### 72", "72", "hash"),
    ("#### 1,234.", "1,234", "hash"),
    ("Thus, the answer is 3.5.", "3.5", "answer_is"),
    ("The final answer is: **42**", "42", "answer_is"),
    ("I have 4 apples and then 7 pears", "7", "last_number"),
    ("We get -0.25 overall", "-0.25", "last_number"),
])
def test_extraction_strategies(text: str, answer: str, method: str) -> None:
    found = extract_answer(text)
    assert found is not None and (found.answer, found.method) == (answer, method)


def test_extraction_finds_nothing() -> None:
    assert extract_answer("no digits here at all") is None
    assert extract_answer("#### 5", strategies=["boxed"]) is None


def test_ground_truth_forms() -> None:
    assert ground_truth_answers("He has 5 + 3 = <<5+3=8>>8 apples.\n#### 8") == ["8"]
    assert ground_truth_answers(r"\boxed{\pi}") == [r"\pi"]
    assert ground_truth_answers(12) == ["12"]
    assert ground_truth_answers(["1/2", 0.5]) == ["1/2", "0.5"]


@pytest.mark.parametrize("text, value", [
    ("1,234", 1234), ("-17", -17), ("0.125", 0.125), ("3/4", 0.75), (r"\frac{3}{4}", 0.75),
    ("1 1/2", 1.5), ("$18.00", 18), ("18 dollars", 18), ("2.5e3", 2500), ("50%", 50),
])
def test_parse_number(text: str, value: float) -> None:
    n = parse_number(text)
    assert n is not None and float(n.value) == value


@pytest.mark.parametrize("text", ["2x", "3 pi", "x+1", "", "1/0", "abc"])
def test_parse_number_refuses_non_numbers(text: str) -> None:
    assert parse_number(text) is None


@pytest.mark.parametrize("pred, truth, equal", [
    ("1/2", "0.5", True),
    ("1,000", "1000", True),
    ("50%", "50", True),
    ("50%", "0.5", True),
    ("0.33", "1/3", False),
    ("72", "72.0", True),
    ("-3", "3", False),
    ("Paris", "paris", True),
])
async def test_numeric_and_text_equivalence_without_sympy(pred: str, truth: str, equal: bool) -> None:
    assert (await answers_equal(pred, truth, checker=None)).equal is equal


@pytest.fixture(scope="module")
def checker() -> SymbolicChecker:
    c = SymbolicChecker()
    yield c
    c.close()


@pytest.mark.parametrize("pred, truth, equal", [
    (r"\frac{1}{\sqrt{2}}", r"\frac{\sqrt{2}}{2}", True),
    ("(x+1)^2", "x^2+2x+1", True),
    (r"2\pi", r"\pi \cdot 2", True),
    ("x+1", "x+2", False),
    (r"\sqrt{8}", r"2\sqrt{2}", True),
])
async def test_symbolic_equivalence(checker: SymbolicChecker, pred: str, truth: str, equal: bool) -> None:
    verdict = await answers_equal(pred, truth, checker=checker)
    assert verdict.equal is equal and verdict.how == "symbolic"


@pytest.mark.parametrize("dangerous", [
    "__import__('os').system('touch /tmp/rft-pwned')", "(1).__class__", "open('x')", "eval('1')",
    "lambda: 1", "x" * 500, "2**99999",
])
def test_whitelist_refuses_code(dangerous: str) -> None:
    assert to_sympy_syntax(dangerous) is None


async def test_slow_expression_is_cut_off_and_the_worker_recovers(checker: SymbolicChecker) -> None:
    verdict = await answers_equal("9^{9^{9}}", "1", checker=checker, symbolic_timeout=1.0)
    assert verdict.equal is False and "timed out" in verdict.detail
    assert checker.restarts >= 1
    again = await answers_equal("(a+b)^2", "a^2+2ab+b^2", checker=checker)
    assert again.equal is True


async def test_injection_is_not_executed(tmp_path: object) -> None:
    marker = "/tmp/rft-math-pwned-marker"
    ev = MathEvaluator({})
    await ev.score(Sample(text=rf"\boxed{{__import__('os').system('touch {marker}')}}"), Item(ground_truth="1"))
    assert not os.path.exists(marker)


async def test_math_evaluator_rewards_and_reasons() -> None:
    ev = MathEvaluator({})
    right = await ev.score(Sample(text=r"... so \boxed{\frac{1}{2}}"), Item(ground_truth="0.5"))
    assert right.reward == 1.0 and right.error is None and "boxed" in right.reason
    wrong = await ev.score(Sample(text="The answer is 41."), Item(ground_truth="#### 42"))
    assert wrong.reward == 0.0 and wrong.error is None and "differs" in wrong.reason
    commas = await ev.score(Sample(text="Total: $1,250 dollars.\n#### 1,250"), Item(ground_truth=1250))
    assert commas.reward == 1.0
    none = await ev.score(Sample(text="I don't know"), Item(ground_truth="3"))
    assert none.reward == 0.0 and none.error == "parse_error" and none.metrics["answer_found"] == 0.0
    na = await ev.score(Sample(text="5"), Item(ground_truth=None))
    assert na.reward is None


def test_math_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match="strategies"):
        MathEvaluator({"strategies": ["boxed", "guess"]})
    with pytest.raises(ConfigError, match="relTol"):
        MathEvaluator({"relTol": "small"})
    with pytest.raises(ConfigError, match="unknown field.*tolerance"):
        MathEvaluator({"tolerance": 0.1})
