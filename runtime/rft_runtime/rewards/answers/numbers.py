"""Exact parsing of numeric answers: integers, decimals, thousands separators, fractions (``1/2``,
``\\frac{1}{2}``), mixed numbers, percentages and trailing unit words."""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["Number", "clean_answer", "parse_number", "numbers_equal"]

_MATH_WORDS = {"pi", "sqrt", "e", "i", "inf", "infty", "log", "ln", "sin", "cos", "tan", "exp", "oo"}
_TEXT_CMD = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_DECIMAL = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+"
_NUM_RE = re.compile(
    rf"^(?P<sign>[-+])?\s*(?:(?P<whole>\d+)\s+(?=\d+\s*/))?(?P<num>{_DECIMAL})"
    rf"(?:\s*/\s*(?P<den>{_DECIMAL}))?(?:[eE](?P<exp>[-+]?\d{{1,4}}))?"
    rf"\s*(?P<pct>%|percent)?(?P<units>(?:\s+[A-Za-z]{{2,}}\.?){{0,3}})$"
)
_FRAC_RE = re.compile(r"^(?P<sign>[-+])?\s*\\[dt]?frac\s*\{\s*(?P<num>[-+]?" + _DECIMAL + r")\s*\}\s*\{\s*(?P<den>[-+]?"
                      + _DECIMAL + r")\s*\}\s*(?P<pct>%)?$")


@dataclass(frozen=True)
class Number:
    """An exact value; ``percent`` when it was written with ``%`` (the value is then the number
    before the sign: ``50%`` → value 50, percent True)."""

    value: Fraction
    percent: bool = False


def clean_answer(s: str) -> str:
    """Normalises an answer string: drops ``$``, ``\\left``/``\\right``, spacing commands, text
    wrappers (keeping their content), ``^\\circ``, a leading ``x =`` and trailing punctuation."""
    s = s.strip()
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\(?:left|right|displaystyle|!|,|;|:)", " ", s)
    s = s.replace("~", " ")
    for _ in range(3):
        s = _TEXT_CMD.sub(r" \1 ", s)
    s = re.sub(r"\^\s*\{?\\circ\}?|°", "", s)
    s = s.replace("\\%", "%")
    s = re.sub(r"^[A-Za-z]\s*=\s*(?=\S)", "", s)
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"[.;:!?]+$", "", s).strip()
    return s


def _decimal(text: str) -> Fraction:
    text = text.replace(",", "")
    if text.endswith("."):
        text = text[:-1]
    return Fraction(text)


def parse_number(s: str) -> Number | None:
    """The exact value of a numeric answer, or None when it is not a plain number.

    ``"1,234.50"`` → 2469/2, ``"3/4"`` and ``"\\frac{3}{4}"`` → 3/4, ``"1 1/2"`` → 3/2,
    ``"50%"`` → 50 (percent), ``"18 dollars"`` → 18. ``"2x"`` and ``"3 pi"`` are not numbers.
    """
    s = clean_answer(s)
    if not s or len(s) > 64:
        return None
    m = _FRAC_RE.match(s)
    if m:
        den = _decimal(m.group("den").lstrip("+"))
        if den == 0:
            return None
        value = _decimal(m.group("num").lstrip("+")) / den
        return Number(-value if m.group("sign") == "-" else value, bool(m.group("pct")))
    m = _NUM_RE.match(s)
    if not m:
        return None
    units = m.group("units").split()
    if any(u.rstrip(".").lower() in _MATH_WORDS for u in units):
        return None
    value = _decimal(m.group("num"))
    if m.group("den"):
        den = _decimal(m.group("den"))
        if den == 0:
            return None
        value /= den
    if m.group("whole"):
        value += int(m.group("whole"))
    if m.group("exp"):
        value *= Fraction(10) ** int(m.group("exp"))
    if m.group("sign") == "-":
        value = -value
    return Number(value, bool(m.group("pct")))


def _close(a: Fraction, b: Fraction, rel_tol: float) -> bool:
    if a == b:
        return True
    return abs(a - b) <= Fraction(rel_tol) * max(abs(a), abs(b))


def numbers_equal(a: Number, b: Number, rel_tol: float = 1e-9) -> bool:
    """Exact (or within ``rel_tol``) equality; a percentage also matches its fraction
    (``50%`` equals ``50`` and ``0.5``)."""
    options_a = [a.value] + ([a.value / 100] if a.percent else [])
    options_b = [b.value] + ([b.value / 100] if b.percent else [])
    return any(_close(x, y, rel_tol) for x in options_a for y in options_b)
