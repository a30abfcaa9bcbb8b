"""Builtin ``math``: extract the final answer and compare it with the ground truth.

Config (all optional): ``strategies`` (order of ``boxed``, ``hash``, ``answer_is``, ``last_number``;
default all, in that order), ``relTol`` (1e-9), ``symbolic`` (true: sympy for expressions),
``symbolicTimeoutSeconds`` (3), ``maxAnswerChars`` (200: longer answers are never given to sympy).

The ground truth (``rewards.answers.ground_truth_answers``) is a string, a number, an object with
``answer``, or a list of these (any one may match). A string holding ``####`` is a GSM8K solution
(``"...worked solution...\\n#### 1,234"``): its answer is the text after the last ``####``, thousands
commas dropped, so a GSM8K-format dataset needs only ``fields: {prompt: question, ground_truth:
answer}``. Otherwise a string's last ``\\boxed{}``, else the whole string.

Reward 1.0 when the answer equals any ground-truth answer, else 0.0. No answer found: 0.0 with
``error="parse_error"``. No ground truth: None (not applicable).
"""

from __future__ import annotations

from typing import Any, Mapping

from ..answers import STRATEGIES, answers_equal, default_checker, extract_answer, ground_truth_answers, numeric_core
from ..options import Options
from ..registry import register_builtin
from ..types import Item, Sample, ScoreResult

__all__ = ["MathEvaluator"]


@register_builtin("math")
class MathEvaluator:
    """Rule-based math reward (see the module docstring for the config)."""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        opts = Options(config, "math config")
        self.strategies = tuple(opts.str_list("strategies", list(STRATEGIES)))
        for s in self.strategies:
            if s not in STRATEGIES:
                raise opts.error("strategies", f"has unknown strategy {s!r}; known: {', '.join(STRATEGIES)}")
        self.rel_tol = opts.number("relTol", 1e-9, minimum=0, maximum=0.5)
        self.symbolic = opts.bool("symbolic", True)
        self.symbolic_timeout = opts.number("symbolicTimeoutSeconds", 3.0, minimum=0.01, maximum=600)
        self.max_chars = opts.number("maxAnswerChars", 200, minimum=1, maximum=10_000, integer=True)
        opts.done()

    async def score(self, sample: Sample, item: Item) -> ScoreResult:
        """1.0/0.0 with a reason; parse_error when no answer can be extracted."""
        truths = ground_truth_answers(item.ground_truth)
        if not truths:
            return ScoreResult(None, "math: the item has no ground truth")
        found = extract_answer(sample.text, self.strategies)
        if found is None:
            return ScoreResult(0.0, "math: no answer found in the completion", {"answer_found": 0.0},
                               error="parse_error")
        pred = found.answer if found.method == "boxed" else numeric_core(found.answer)
        checker = default_checker() if self.symbolic else None
        notes = []
        for truth in truths:
            verdict = await answers_equal(pred, numeric_core(truth), checker=checker, rel_tol=self.rel_tol,
                                          symbolic_timeout=self.symbolic_timeout, max_chars=self.max_chars)
            if verdict.equal:
                return ScoreResult(1.0, f"math: {pred!r} ({found.method}) equals {truth!r} ({verdict.how})",
                                   {"answer_found": 1.0})
            if verdict.detail:
                notes.append(verdict.detail)
        shown = truths[0] if len(truths) == 1 else truths
        extra = f"; {notes[0]}" if notes else ""
        return ScoreResult(0.0, f"math: {pred!r} ({found.method}) differs from {shown!r}{extra}", {"answer_found": 1.0})
