"""Deciding whether a predicted answer equals a ground-truth answer."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .extract import NUMBER_RE
from .latex import to_sympy_syntax
from .numbers import clean_answer, numbers_equal, parse_number
from .symbolic import SymbolicChecker

__all__ = ["Verdict", "answers_equal", "numeric_core"]


@dataclass(frozen=True)
class Verdict:
    """``equal``; ``how`` it was decided (string, number, symbolic); ``detail`` when undecidable."""

    equal: bool
    how: str
    detail: str = ""


def _canonical_text(s: str) -> str:
    return re.sub(r"\s+", "", clean_answer(s)).lower()


def numeric_core(answer: str) -> str:
    """For answers like "18 dollars per hour" that are not a plain number or expression: the
    single number they contain (unchanged when there are several or none)."""
    if parse_number(answer) is not None or to_sympy_syntax(answer) is not None:
        return answer
    numbers = NUMBER_RE.findall(clean_answer(answer))
    return numbers[0] if len(numbers) == 1 else answer


async def answers_equal(pred: str, truth: str, *, checker: SymbolicChecker | None, rel_tol: float = 1e-9,
                        symbolic_timeout: float = 3.0, max_chars: int = 200) -> Verdict:
    """Equal as text (after normalisation), as exact numbers, or symbolically (sympy, in the
    checker's worker process, only for short whitelisted expressions)."""
    if _canonical_text(pred) == _canonical_text(truth) and _canonical_text(pred):
        return Verdict(True, "string")
    a, b = parse_number(pred), parse_number(truth)
    if a is not None and b is not None:
        return Verdict(numbers_equal(a, b, rel_tol), "number")
    if checker is None:
        return Verdict(False, "number" if a is not None or b is not None else "string")
    sa, sb = to_sympy_syntax(pred, max_chars), to_sympy_syntax(truth, max_chars)
    if sa is None or sb is None:
        which = "prediction" if sa is None else "ground truth"
        return Verdict(False, "string", f"{which} is not a simple expression")
    equal, detail = await checker.compare(sa, sb, timeout=symbolic_timeout, rel_tol=rel_tol)
    if equal is None:
        return Verdict(False, "symbolic", detail)
    return Verdict(equal, "symbolic")
