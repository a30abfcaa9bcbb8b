"""Builtin ``string_check``: compare the completion with a reference string.

Config: ``operation`` (``eq`` | ``ne`` | ``like`` | ``ilike``, required), ``reference`` (default: the
item's ground truth), ``strip`` (true: trim surrounding whitespace of both sides first).
``like`` is SQL LIKE over the whole text (``%`` any run, ``_`` one character, ``\\`` escapes);
``ilike`` is the case-insensitive ``like``. Reward 1.0 when the check holds, else 0.0.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from ..options import Options
from ..registry import register_builtin
from ..types import Item, Sample, ScoreResult

__all__ = ["StringCheckEvaluator", "like_to_regex"]

OPERATIONS = ("eq", "ne", "like", "ilike")


def like_to_regex(pattern: str, case_insensitive: bool = False) -> re.Pattern[str]:
    """A compiled regex matching exactly what SQL ``LIKE pattern`` matches (escape character ``\\``)."""
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    flags = re.DOTALL | (re.IGNORECASE if case_insensitive else 0)
    return re.compile("".join(out), flags)


@register_builtin("string_check")
class StringCheckEvaluator:
    """eq / ne / like / ilike against ``reference`` or the ground truth."""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        opts = Options(config, "string_check config")
        self.operation = opts.str("operation", choices=OPERATIONS)
        self.reference = opts.str("reference", None)
        self.strip = opts.bool("strip", True)
        opts.done()
        self._compiled = None if self.reference is None or self.operation in ("eq", "ne") else \
            like_to_regex(self._prep(self.reference), self.operation == "ilike")

    def _prep(self, s: str) -> str:
        return s.strip() if self.strip else s

    async def score(self, sample: Sample, item: Item) -> ScoreResult:
        """1.0 when the check holds; None when there is neither a reference nor a ground truth."""
        reference = self.reference
        if reference is None:
            if item.ground_truth is None:
                return ScoreResult(None, "string_check: no reference and no ground truth")
            reference = item.ground_truth if isinstance(item.ground_truth, str) else str(item.ground_truth)
        text, ref = self._prep(sample.text), self._prep(reference)
        if self.operation == "eq":
            ok = text == ref
        elif self.operation == "ne":
            ok = text != ref
        else:
            pattern = self._compiled or like_to_regex(ref, self.operation == "ilike")
            ok = pattern.fullmatch(text) is not None
        verb = {"eq": "equals", "ne": "differs from", "like": "is LIKE", "ilike": "is ILIKE"}[self.operation]
        status = "holds" if ok else "fails"
        return ScoreResult(1.0 if ok else 0.0, f"string_check: 'text {verb} {_short(ref)}' {status}")


def _short(s: str, n: int = 60) -> str:
    return repr(s if len(s) <= n else s[:n] + "...")
