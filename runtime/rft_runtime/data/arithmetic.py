"""``arithmetic``: seeded integer arithmetic questions a tiny model can learn.

"What is 17 + 5?" (optionally followed by "Answer with just the number.") with ground truth
``"22"``. Prompts are short on purpose: the tiny model trains and samples on CPU. Subtractions never go
below zero (the larger operand comes first) and products use operands up to ``max_factor``.
"""

from __future__ import annotations

import random
from typing import Any

from .registry import register_dataset
from .task import DatasetError, Task

__all__ = ["arithmetic", "arithmetic_question", "ARITHMETIC_SUFFIX"]

ARITHMETIC_SUFFIX = "Answer with just the number."
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def arithmetic_question(a: int, op: str, b: int, instruction: bool = False) -> str:
    """The user prompt for ``a op b`` (with :data:`ARITHMETIC_SUFFIX` when ``instruction``)."""
    q = f"What is {a} {op} {b}?"
    return f"{q} {ARITHMETIC_SUFFIX}" if instruction else q


@register_dataset("arithmetic")
def arithmetic(
    n: int,
    seed: int,
    *,
    max_operand: int = 20,
    ops: str = "+-",
    max_factor: int = 9,
    instruction: bool = False,
    id_prefix: str | None = None,
    **unknown: Any,
) -> list[Task]:
    """``n`` seeded questions over operands ``0..max_operand`` and operators ``ops``.

    Options: ``max_operand`` (>= 1), ``ops`` (a string of ``+``, ``-``, ``*``), ``max_factor``
    (operand bound for ``*``), ``instruction`` (append "Answer with just the number."),
    ``id_prefix`` (task ids are ``{id_prefix}-{i}``; default
    ``arithmetic-s{seed}``). Same ``(n, seed, options)`` gives the same tasks.
    """
    if unknown:
        raise DatasetError(f"builtin dataset 'arithmetic': unknown option(s) {sorted(unknown)}; "
                           "known: max_operand, ops, max_factor, instruction, id_prefix")
    if not isinstance(max_operand, int) or max_operand < 1:
        raise DatasetError("builtin dataset 'arithmetic': field 'max_operand' must be an integer >= 1")
    if not ops or any(o not in _OPS for o in ops):
        raise DatasetError(f"builtin dataset 'arithmetic': field 'ops' must use only {''.join(_OPS)}, got {ops!r}")
    if not isinstance(max_factor, int) or max_factor < 1:
        raise DatasetError("builtin dataset 'arithmetic': field 'max_factor' must be an integer >= 1")
    rng = random.Random(f"arithmetic:{seed}")
    prefix = id_prefix or f"arithmetic-s{seed}"
    tasks = []
    for i in range(n):
        op = ops[rng.randrange(len(ops))]
        hi = max_factor if op == "*" else max_operand
        a, b = rng.randint(0, hi), rng.randint(0, hi)
        if op == "-" and b > a:
            a, b = b, a
        answer = _OPS[op](a, b)
        tasks.append(
            Task(
                task_id=f"{prefix}-{i}",
                messages=[{"role": "user", "content": arithmetic_question(a, op, b, instruction)}],
                ground_truth=str(answer),
                domain="math",
                metadata={"a": a, "b": b, "op": op, "solution": str(answer)},
            )
        )
    return tasks
