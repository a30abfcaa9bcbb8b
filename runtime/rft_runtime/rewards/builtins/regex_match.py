"""Builtin ``regex``: reward 1.0 when the completion matches a regular expression.

Config: ``pattern`` (required; Python ``re`` syntax), ``flags`` (letters ``i``, ``m``, ``s``, ``x``, ``a``
or a list of names such as ``IGNORECASE``), ``fullMatch`` (false: search anywhere; true: the whole
stripped text must match), ``maxInputChars`` (100000: longer completions are cut before matching).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from ..options import Options
from ..registry import register_builtin
from ..types import Item, Sample, ScoreResult

__all__ = ["RegexEvaluator", "parse_flags"]

_LETTERS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE, "a": re.ASCII}
_NAMES = {"IGNORECASE": re.IGNORECASE, "MULTILINE": re.MULTILINE, "DOTALL": re.DOTALL,
          "VERBOSE": re.VERBOSE, "ASCII": re.ASCII}


def parse_flags(flags: str | list[str] | None) -> int:
    """``"im"`` or ``["IGNORECASE", "MULTILINE"]`` → re flags; raises ValueError naming a bad flag."""
    if flags is None:
        return 0
    value = 0
    if isinstance(flags, str):
        for letter in flags.lower():
            if letter not in _LETTERS:
                raise ValueError(f"unknown flag {letter!r}; known: {', '.join(_LETTERS)}")
            value |= _LETTERS[letter]
        return value
    for name in flags:
        key = name.upper()
        if key not in _NAMES:
            raise ValueError(f"unknown flag {name!r}; known: {', '.join(_NAMES)}")
        value |= _NAMES[key]
    return value


@register_builtin("regex")
class RegexEvaluator:
    """Search (or full match) of ``pattern`` in the completion text."""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        opts = Options(config, "regex config")
        pattern = opts.str("pattern")
        raw_flags = opts.any("flags", None)
        if raw_flags is not None and not isinstance(raw_flags, (str, list)):
            raise opts.error("flags", "must be a string of letters or a list of flag names")
        try:
            flags = parse_flags(raw_flags)
        except ValueError as exc:
            raise opts.error("flags", str(exc)) from None
        self.full_match = opts.bool("fullMatch", False)
        self.max_chars = opts.number("maxInputChars", 100_000, minimum=1, integer=True)
        opts.done()
        try:
            self.pattern = re.compile(pattern, flags)
        except re.error as exc:
            raise opts.error("pattern", f"is not a valid regular expression: {exc}") from None

    async def score(self, sample: Sample, item: Item) -> ScoreResult:
        """1.0 on a match, else 0.0."""
        text = sample.text[: self.max_chars]
        m = self.pattern.fullmatch(text.strip()) if self.full_match else self.pattern.search(text)
        how = "fully match" if self.full_match else "match"
        if m:
            return ScoreResult(1.0, f"regex: text does {how} /{self.pattern.pattern}/ at {m.start()}..{m.end()}")
        return ScoreResult(0.0, f"regex: text does not {how} /{self.pattern.pattern}/")
