"""A small LaTeX → sympy-syntax translator for answers, with a strict whitelist.

The output is fed to ``sympy.parse_expr`` (which evaluates Python), so only digits, single-letter
symbols, a few function names, operators and parentheses may pass: anything else is refused.
"""

from __future__ import annotations

import keyword
import re

from .numbers import clean_answer

__all__ = ["to_sympy_syntax", "ALLOWED_FUNCTIONS"]

ALLOWED_FUNCTIONS = {"sqrt", "pi", "oo", "sin", "cos", "tan", "log", "exp", "E", "I"}
_SIMPLE_COMMANDS = {
    "\\cdot": "*", "\\times": "*", "\\div": "/", "\\pi": " pi ", "\\infty": " oo ",
    "\\ln": " log", "\\log": " log", "\\sin": " sin", "\\cos": " cos", "\\tan": " tan", "\\exp": " exp",
}
_SAFE_CHARS = re.compile(r"^[0-9A-Za-z+\-*/().\s]*$")
_IDENT = re.compile(r"[A-Za-z]+")


def _group(s: str, i: int) -> tuple[str, int]:
    """The argument starting at ``s[i]``: a balanced ``{...}`` group or a single character."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        raise ValueError("missing argument")
    if s[i] != "{":
        return s[i], i + 1
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return s[i + 1:j], j + 1
    raise ValueError("unbalanced braces")


def _translate(s: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(s):
        if s.startswith("\\frac", i) or s.startswith("\\dfrac", i) or s.startswith("\\tfrac", i):
            i = s.index("frac", i) + 4
            num, i = _group(s, i)
            den, i = _group(s, i)
            out.append(f"(({_translate(num)})/({_translate(den)}))")
        elif s.startswith("\\sqrt", i):
            i += 5
            index = None
            if i < len(s) and s[i] == "[":
                close = s.index("]", i)
                index, i = s[i + 1:close], close + 1
            arg, i = _group(s, i)
            if index is None:
                out.append(f"sqrt({_translate(arg)})")
            else:
                out.append(f"(({_translate(arg)})**(1/({_translate(index)})))")
        elif s[i] == "^":
            arg, i = _group(s, i + 1)
            out.append(f"**({_translate(arg)})")
        elif s[i] == "\\":
            m = re.match(r"\\[A-Za-z]+", s[i:])
            if not m or m.group(0) not in _SIMPLE_COMMANDS:
                raise ValueError(f"unsupported command {s[i:i + 12]!r}")
            out.append(_SIMPLE_COMMANDS[m.group(0)])
            i += len(m.group(0))
        elif s[i] in "{}":
            out.append("(" if s[i] == "{" else ")")
            i += 1
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def to_sympy_syntax(answer: str, max_chars: int = 200) -> str | None:
    """Sympy syntax for a LaTeX or plain expression answer, or None when it is not a safe, simple
    expression (too long, unknown commands or names, attribute access, underscores, quotes...)."""
    s = clean_answer(answer)
    if not s or len(s) > max_chars:
        return None
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)  # thousands separators
    try:
        expr = _translate(s)
    except (ValueError, IndexError):
        return None
    expr = expr.replace("%", "/100")
    if not _SAFE_CHARS.match(expr) or re.search(r"\.(?!\d)|(?<![\d\s(*/+\-])\.", expr):
        return None
    for name in _IDENT.findall(expr):
        # known functions, or up to 3 single-letter symbols multiplied implicitly ("xy"); never a keyword
        if name not in ALLOWED_FUNCTIONS and (len(name) > 3 or keyword.iskeyword(name)):
            return None
    if re.search(r"\*\*\s*\(?\s*[-+]?\d{4,}", expr):
        return None  # huge exponents
    if len(expr) > 4 * max_chars:
        return None
    return expr
