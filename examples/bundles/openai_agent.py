"""A tool-calling agent written for the official OpenAI Python client, run by rft unchanged.

`solve()` is an ordinary agent: it calls `chat.completions.create(..., tools=[calculator])` on the
`openai.AsyncOpenAI` client it is given, runs the calculator for each tool call, and stops at the
first reply without one or after MAX_TURNS replies. Nothing in it knows about rft.

Run by rft, the agent's client points at the rollout pod's recording gateway: the bundle's
`rollout(task, client)` builds `AsyncOpenAI(base_url=client.base_url, api_key=client.api_key)`, so
every call is sampled from the policy being trained and recorded with its token ids and log-probs
(the tool results are tokens the model did not sample, mask 0). Run as a program, the agent reads
the standard `OPENAI_BASE_URL` and `OPENAI_API_KEY` (and `OPENAI_MODEL`) from its environment, which is
how an agent in a subprocess (any language) is pointed at the gateway:
`subprocess.run([...], env={**os.environ, **client.openai_env()})`.
"""

from __future__ import annotations

import ast
import asyncio
import json
import operator
import os
import re
import sys
from typing import Any

from openai import AsyncOpenAI

SYSTEM = "Solve the problem. Use the calculator tool for arithmetic. When you are done, write 'ANSWER: <number>'."
TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}]
MAX_TURNS = 3
MAX_TOKENS_PER_TURN = 96
_ANSWER = re.compile(r"ANSWER:\s*(-?\d+(?:\.\d+)?)")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg, ast.UAdd: operator.pos}


def evaluate(expression: str) -> str:
    """The calculator tool: numbers and + - * / only (parsed with ast); an error message otherwise."""
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * / are allowed")
    try:
        result = value(ast.parse(expression[:200].strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"error: {e or type(e).__name__}"
    return str(int(result)) if float(result).is_integer() else f"{result:.6g}"


async def solve(client: AsyncOpenAI, model: str, question: str) -> tuple[str, int]:
    """The agent: (its final reply, the number of calculator calls)."""
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    calls = 0
    reply = ""
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                                        max_tokens=MAX_TOKENS_PER_TURN)
        message = response.choices[0].message
        messages.append(message)
        reply = message.content or ""
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            calls += 1
            messages.append({"role": "tool", "tool_call_id": call.id, "content": evaluate(str(expression))})
    return reply, calls


async def rollout(task: Any, client: Any) -> dict[str, Any]:
    """rft's entry point: the agent, with its own OpenAI client pointed at this episode's gateway."""
    env = client.openai_env()
    async with AsyncOpenAI(base_url=env["OPENAI_BASE_URL"], api_key=env["OPENAI_API_KEY"], max_retries=0) as agent_client:
        reply, calls = await solve(agent_client, env["OPENAI_MODEL"], task.prompt or task.chat_messages()[-1]["content"])
    answer = _ANSWER.search(reply)
    numbers = _NUMBER.findall(reply)  # a reply without "ANSWER:" is read as its last number
    return {"metrics": {"calculator_calls": calls},
            "output": answer.group(1) if answer else (numbers[-1] if numbers else None)}


def score(sample: Any, item: Any) -> float | None:
    """1.0 when the final `ANSWER:` equals the ground truth numerically, else 0.0."""
    if item.ground_truth is None:
        return None
    try:
        return 1.0 if abs(float(sample.output) - float(item.ground_truth)) < 1e-9 else 0.0
    except (TypeError, ValueError):
        return 0.0


async def _main() -> None:
    async with AsyncOpenAI() as client:  # OPENAI_BASE_URL, OPENAI_API_KEY
        reply, calls = await solve(client, os.environ.get("OPENAI_MODEL", "policy"), " ".join(sys.argv[1:]))
    print(json.dumps({"reply": reply, "calculator_calls": calls}))


if __name__ == "__main__":
    asyncio.run(_main())
