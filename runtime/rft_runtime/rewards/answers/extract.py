"""Finding the final answer in a completion: ``\\boxed{...}``, ``#### N``, "the answer is N", or
the last number."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["STRATEGIES", "Extracted", "find_boxed", "extract_answer", "ground_truth_answers", "NUMBER_RE"]

STRATEGIES = ("boxed", "hash", "answer_is", "last_number")

NUMBER_RE = re.compile(
    r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?%?"
    r"|[-+]?\.\d+%?"
)
_HASH_RE = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS_RE = re.compile(
    r"(?i)\b(?:the\s+)?(?:final\s+)?answer\s*(?:is\s*:?|:|=)\s*(?:\*\*)?\s*([^\n]*)"
)
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*")


@dataclass(frozen=True)
class Extracted:
    """An answer string and the strategy that found it."""

    answer: str
    method: str


def _brace_group(text: str, start: int) -> tuple[str, int] | None:
    """The content of the balanced ``{...}`` starting at ``text[start] == '{'`` and the index after it."""
    depth = 0
    for i in range(start, len(text)):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            continue
        if ch == "{" and (i == 0 or text[i - 1] != "\\"):
            depth += 1
        elif ch == "}" and (i == 0 or text[i - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return text[start + 1:i], i + 1
    return None


def find_boxed(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces kept), in order."""
    found = []
    for m in _BOXED_RE.finditer(text):
        pos = m.end()
        if pos < len(text) and text[pos] == "{":
            group = _brace_group(text, pos)
            if group is not None:
                found.append(group[0].strip())
        else:
            token = re.match(r"[^\s$]+", text[pos:])  # "\boxed 5"
            if token:
                found.append(token.group(0))
    return found


def _tidy(fragment: str) -> str:
    """Trims markdown and sentence punctuation around an answer phrase."""
    s = fragment.strip()
    s = re.sub(r"^\*\*|\*\*$", "", s).strip()
    s = s.strip("*").strip()
    s = re.sub(r"[.;:!?,]+$", "", s).strip()
    if s.startswith("$") and s.endswith("$") and len(s) > 1:
        s = s.strip("$").strip()
    return s


def extract_answer(text: str, strategies: tuple[str, ...] | list[str] = STRATEGIES) -> Extracted | None:
    """The answer by the first strategy (in the given order) that finds one, else None.

    ``boxed`` takes the last box; ``hash`` the text after the last ``####``; ``answer_is`` the phrase
    after the last "answer is"/"answer:"; ``last_number`` the last number in the text.
    """
    for strategy in strategies:
        if strategy == "boxed":
            boxes = find_boxed(text)
            if boxes and boxes[-1]:
                return Extracted(boxes[-1], "boxed")
        elif strategy == "hash":
            hits = [_tidy(m.group(1)) for m in _HASH_RE.finditer(text)]
            hits = [h for h in hits if h]
            if hits:
                return Extracted(hits[-1], "hash")
        elif strategy == "answer_is":
            hits = [_tidy(m.group(1)) for m in _ANSWER_IS_RE.finditer(text)]
            hits = [h for h in hits if h]
            if hits:
                return Extracted(hits[-1], "answer_is")
        elif strategy == "last_number":
            numbers = NUMBER_RE.findall(text)
            if numbers:
                return Extracted(numbers[-1].strip(), "last_number")
        else:
            raise ValueError(f"unknown extraction strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    return None


_THOUSANDS_RE = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def ground_truth_answers(ground_truth: object) -> list[str]:
    """Acceptable answers from a ground truth: a string, a number, a ``{"answer": ...}`` object, or a
    list of these. A string that holds ``####`` is a GSM8K solution: its answer is the text after the
    last ``####`` (a number's thousands commas dropped: ``#### 1,234`` → ``1234``); else its last
    ``\\boxed{}``; else the whole string."""
    if ground_truth is None:
        return []
    if isinstance(ground_truth, (list, tuple)):
        out: list[str] = []
        for g in ground_truth:
            out.extend(ground_truth_answers(g))
        return out
    if isinstance(ground_truth, bool):
        return [str(ground_truth).lower()]
    if isinstance(ground_truth, (int, float)):
        return [repr(ground_truth) if isinstance(ground_truth, float) else str(ground_truth)]
    if isinstance(ground_truth, dict) and "answer" in ground_truth:
        return ground_truth_answers(ground_truth["answer"])
    s = str(ground_truth)
    if "####" in s:
        found = extract_answer(s, ("hash",))
        if found:
            answer = found.answer
            return [answer.replace(",", "") if _THOUSANDS_RE.fullmatch(answer) else answer]
    boxes = find_boxed(s)
    if boxes:
        return [boxes[-1]]
    return [s.strip()]
