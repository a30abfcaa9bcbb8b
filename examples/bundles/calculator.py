"""Calculator tool environment: a worked multi-turn evaluator bundle.

The model may ask a calculator for help by writing `<calc>EXPRESSION</calc>`; the environment
evaluates the expression and answers in a `tool` message; the model finishes with
`ANSWER: <number>`. The rollout ends at the first reply without a calculator request, or after
MAX_TURNS replies.

This file uses nothing from rft: it talks to the model through the `client` argument, which has the
call shape of the OpenAI Python client (`await client.chat.completions.create(...)`). Run by rft, the
client is the training-aware processor, so each reply keeps its token ids and logprobs and the tool
results are appended as tokens the model did not sample (response mask 0).

Reference it as `examples/bundles/calculator.py` (file path) or, installed as a module,
`calculator` / `calculator:rollout`.
"""

from __future__ import annotations

import ast
import operator
import re
from typing import Any

SYSTEM = (
    "Solve the problem. You may use a calculator: write <calc>EXPRESSION</calc> and wait for the "
    "result. When you are done, write 'ANSWER: <number>'."
)
MAX_TURNS = 4
MAX_TOKENS_PER_TURN = 48

_CALC = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)
_ANSWER = re.compile(r"ANSWER:\s*(-?\d+(?:\.\d+)?)")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate(expression: str) -> str:
    """Evaluate + - * / on numbers (no names, no calls); an error message for anything else."""
    if len(expression) > 200:
        return "error: expression too long"
    try:
        tree = ast.parse(expression.strip(), mode="eval")
        value = _eval(tree.body)
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"error: {e or type(e).__name__}"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    raise ValueError("only numbers and + - * / are allowed")


async def rollout(task: Any, client: Any) -> dict[str, Any]:
    """Run the calculator loop for one task; returns metrics and the final answer for `score`."""
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, *task.chat_messages()]
    calls = 0
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(
            model="policy", messages=messages, max_tokens=MAX_TOKENS_PER_TURN
        )
        reply = response.choices[0].message
        messages.append(reply)
        match = _CALC.search(reply.content or "")
        if match is None:
            break
        calls += 1
        messages.append({"role": "tool", "content": evaluate(match.group(1))})
    answer = _ANSWER.search(messages[-1].content or "") if messages[-1] is reply else None
    return {"metrics": {"calculator_calls": calls}, "output": answer.group(1) if answer else None}


def score(sample: Any, item: Any) -> float | None:
    """1.0 when the final `ANSWER:` equals the ground truth numerically, else 0.0; None without one."""
    if item.ground_truth is None:
        return None
    if sample.output is None:
        return 0.0
    try:
        return 1.0 if abs(float(sample.output) - float(item.ground_truth)) < 1e-9 else 0.0
    except (TypeError, ValueError):
        return 0.0
