"""Builtins ``string_check`` and ``regex``."""

from __future__ import annotations

import pytest

from rft_runtime.rewards import ConfigError, Item, Sample
from rft_runtime.rewards.builtins import RegexEvaluator, StringCheckEvaluator
from rft_runtime.rewards.builtins.string_check import like_to_regex


@pytest.mark.parametrize("op, reference, text, reward", [
    ("eq", "Paris", "Paris", 1.0),
    ("eq", "Paris", " Paris\n", 1.0),
    ("eq", "Paris", "paris", 0.0),
    ("ne", "Paris", "London", 1.0),
    ("ne", "Paris", "Paris", 0.0),
    ("like", "The answer is %", "The answer is 42", 1.0),
    ("like", "a_c", "abc", 1.0),
    ("like", "a_c", "abbc", 0.0),
    ("like", "%cat%", "Concatenate", 1.0),
    ("like", "%Cat%", "concatenate", 0.0),
    ("ilike", "%Cat%", "conCATenate", 1.0),
    ("like", r"100\%", "100%", 1.0),
    ("like", r"100\%", "1000", 0.0),
    ("like", "a.c", "abc", 0.0),  # regex metacharacters are literal
])
async def test_string_check(op: str, reference: str, text: str, reward: float) -> None:
    ev = StringCheckEvaluator({"operation": op, "reference": reference})
    result = await ev.score(Sample(text=text), Item())
    assert result.reward == reward, result.reason


async def test_string_check_uses_ground_truth_and_none_without_it() -> None:
    ev = StringCheckEvaluator({"operation": "eq"})
    assert (await ev.score(Sample(text="42"), Item(ground_truth=42))).reward == 1.0
    assert (await ev.score(Sample(text="42"), Item())).reward is None


def test_like_multiline_text() -> None:
    assert like_to_regex("start%end").fullmatch("start\nmiddle\nend")


def test_string_check_config_errors() -> None:
    with pytest.raises(ConfigError, match="operation.*eq, ne, like, ilike"):
        StringCheckEvaluator({"operation": "contains"})
    with pytest.raises(ConfigError, match="'operation' is required"):
        StringCheckEvaluator({})


async def test_regex_search_full_match_and_flags() -> None:
    ev = RegexEvaluator({"pattern": r"answer:\s*\d+"})
    assert (await ev.score(Sample(text="so the answer: 12 ok"), Item())).reward == 1.0
    assert (await ev.score(Sample(text="ANSWER: 12"), Item())).reward == 0.0
    ci = RegexEvaluator({"pattern": r"answer:\s*\d+", "flags": "i"})
    assert (await ci.score(Sample(text="ANSWER: 12"), Item())).reward == 1.0
    names = RegexEvaluator({"pattern": r"^b$", "flags": ["MULTILINE"]})
    assert (await names.score(Sample(text="a\nb\nc"), Item())).reward == 1.0
    full = RegexEvaluator({"pattern": r"\d+", "fullMatch": True})
    assert (await full.score(Sample(text=" 123\n"), Item())).reward == 1.0
    assert (await full.score(Sample(text="123 apples"), Item())).reward == 0.0


def test_regex_config_errors() -> None:
    with pytest.raises(ConfigError, match="pattern.*not a valid regular expression"):
        RegexEvaluator({"pattern": "(unclosed"})
    with pytest.raises(ConfigError, match="flags.*unknown flag 'q'"):
        RegexEvaluator({"pattern": "x", "flags": "q"})
    with pytest.raises(ConfigError, match="'pattern' is required"):
        RegexEvaluator({})
