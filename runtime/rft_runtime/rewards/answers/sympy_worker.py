"""Standalone sympy comparison worker (stdlib + sympy only), run by :mod:`.symbolic`.

Reads JSON lines ``[a, b, rel_tol]`` from stdin and answers ``["ok", bool]`` or ``["error", msg]``
on stdout, one line each. The first line it writes is ``["ready", null]``. An address-space limit is
set before sympy is imported.
"""

from __future__ import annotations

import json
import resource
import sys

MEMORY_BYTES = 2 << 30


def compare(a: str, b: str, rel_tol: float) -> bool:
    """True when the two sympy-syntax expressions are equal (exactly, or numerically within rel_tol)."""
    import sympy
    from sympy.parsing.sympy_parser import (
        auto_number,
        auto_symbol,
        factorial_notation,
        implicit_multiplication_application,
        parse_expr,
    )

    names = {
        "__builtins__": {}, "Symbol": sympy.Symbol, "Function": sympy.Function, "Integer": sympy.Integer,
        "Float": sympy.Float, "Rational": sympy.Rational, "sqrt": sympy.sqrt, "pi": sympy.pi, "oo": sympy.oo,
        "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "log": sympy.log, "exp": sympy.exp,
        "E": sympy.E, "I": sympy.I,
    }
    transformations = (auto_symbol, auto_number, factorial_notation, implicit_multiplication_application)
    x = parse_expr(a, local_dict={}, global_dict=dict(names), transformations=transformations)
    y = parse_expr(b, local_dict={}, global_dict=dict(names), transformations=transformations)
    diff = sympy.simplify(x - y)
    if diff == 0:
        return True
    if not (x.free_symbols or y.free_symbols):
        value = complex(sympy.N(diff, 30))
        scale = max(abs(complex(sympy.N(x, 30))), abs(complex(sympy.N(y, 30))), 1e-300)
        return abs(value) <= rel_tol * scale
    return False


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    import sympy  # noqa: F401  (once, before the first request)

    out = sys.stdout
    out.write(json.dumps(["ready", None]) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            a, b, rel_tol = json.loads(line)
            reply = ["ok", bool(compare(str(a), str(b), float(rel_tol)))]
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            reply = ["error", f"{type(exc).__name__}: {exc}"[:300]]
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
