"""``{{ name }}`` prompt templates for the LLM judge, checked when the evaluator is built.

The substitution is deliberately tiny (no template engine): a variable is one of
:data:`TEMPLATE_NAMES`, or ``sample.<field>`` / ``item.<field>`` where ``<field>`` is a declared
field of :class:`~rft_runtime.rewards.types.Sample` / :class:`~rft_runtime.rewards.types.Item`,
followed only by keys into JSON objects (``item.metadata.topic``). There is no attribute walking: a
name starting with ``_`` is refused when the template is built, and nothing but dict keys is
looked up below the field, so no template reaches ``__class__``, ``__globals__`` or ``os.environ``.

Text the policy wrote (``{{response}}``, ``{{sample.text}}``, ``{{sample.messages}}``) is quoted as data: it is
wrapped in ``<answer>…</answer>`` with ``&``, ``<`` and ``>`` escaped, so it cannot close the
delimiter or open another section of the prompt.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from ..types import Item, Sample

__all__ = ["PromptTemplate", "TEMPLATE_NAMES", "quote_answer"]

_VAR = re.compile(r"\{\{\s*([A-Za-z_][\w.]*)\s*\}\}")
TEMPLATE_NAMES = ("question", "response", "ground_truth", "domain", "sample", "item")
_POLICY_TEXT = ("text", "messages")  # sample fields the policy wrote
_FIELDS = {"sample": {f.name for f in dataclasses.fields(Sample)}, "item": {f.name for f in dataclasses.fields(Item)}}


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def quote_answer(text: str) -> str:
    """``text`` as data in the prompt: escaped so it cannot contain ``</answer>`` (or any tag)."""
    escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return f"<answer>\n{escaped}\n</answer>"


def _lookup(value: Any, path: list[str]) -> Any:
    """Keys into JSON objects (dicts) only; anything else ends the lookup with None."""
    for part in path:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
        if value is None:
            return None
    return value


class PromptTemplate:
    """Substitutes ``{{question}}`` (the last user message), ``{{response}}`` (the completion text,
    quoted), ``{{ground_truth}}``, ``{{domain}}`` and dotted paths such as
    ``{{sample.finish_reason}}`` or ``{{item.metadata.topic}}``. Other text, including
    single braces, is left as written."""

    def __init__(self, template: str) -> None:
        self.template = template
        for name in _VAR.findall(template):
            parts = name.split(".")
            root = parts[0]
            if root not in TEMPLATE_NAMES:
                raise ValueError(f"unknown variable {{{{{name}}}}}; known: {', '.join(TEMPLATE_NAMES)}")
            if any(p.startswith("_") or not p for p in parts):
                raise ValueError(f"{{{{{name}}}}}: names starting with '_' are not allowed (no attribute walking)")
            if root in ("sample", "item"):
                if len(parts) < 2:
                    raise ValueError(f"{{{{{name}}}}} needs a field, e.g. {{{{{root}.metadata}}}}")
                if parts[1] not in _FIELDS[root]:
                    raise ValueError(f"{{{{{name}}}}}: {root} has no field {parts[1]!r}; known: "
                                     f"{', '.join(sorted(_FIELDS[root]))}")
            elif len(parts) > 1:
                raise ValueError(f"{{{{{name}}}}}: {root} has no fields")

    def render(self, sample: Sample, item: Item) -> str:
        """The prompt for one sample."""
        question = sample.prompt_text
        if not question and item.messages:
            users = [m for m in item.messages if m.get("role") == "user"]
            question = _text(users[-1].get("content")) if users else ""
        simple = {"question": question, "response": quote_answer(sample.text), "ground_truth": _text(item.ground_truth),
                  "domain": item.domain}

        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            if name in simple:
                return simple[name]
            root, first, *rest = name.split(".")
            obj = sample if root == "sample" else item
            value = _text(_lookup(getattr(obj, first), rest))  # `first` is a declared field (checked above)
            return quote_answer(value) if root == "sample" and first in _POLICY_TEXT else value

        return _VAR.sub(sub, self.template)
