"""Tool-call extraction from sampled text (Qwen/Hermes `<tool_call>{json}</tool_call>` blocks).

Used only when a bundle passes `tools=`; parsing reads the display text and never changes the ids.
"""

from __future__ import annotations

import json
import re
from typing import Callable

from .openai_types import ChatCompletionMessageToolCall, Function

ToolParser = Callable[[str, str], tuple[str | None, list[ChatCompletionMessageToolCall]]]

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_hermes_tool_calls(text: str, call_id_prefix: str) -> tuple[str | None, list[ChatCompletionMessageToolCall]]:
    """Split `text` into (content without well-formed tool-call blocks, tool calls).

    A block whose body is not a JSON object with a string `name` stays in the content (the model
    produced text, not a call). Call ids are `f"{call_id_prefix}-{k}"`, deterministic per sample.
    """
    calls: list[ChatCompletionMessageToolCall] = []
    kept: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", {})
        arguments = args if isinstance(args, str) else json.dumps(args, sort_keys=True)
        calls.append(ChatCompletionMessageToolCall(id=f"{call_id_prefix}-{len(calls)}", function=Function(obj["name"], arguments)))
        kept.append(text[pos : m.start()])
        pos = m.end()
    if not calls:
        return text, []
    kept.append(text[pos:])
    content = "".join(kept).strip()
    return (content or None), calls
