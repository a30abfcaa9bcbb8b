"""``{{ name }}`` prompt templates for the LLM judge, checked when the evaluator is built."""

from __future__ import annotations

import json
import re
from typing import Any

from ..types import Item, Sample

__all__ = ["PromptTemplate", "TEMPLATE_NAMES"]

_VAR = re.compile(r"\{\{\s*([A-Za-z_][\w.]*)\s*\}\}")
TEMPLATE_NAMES = ("question", "response", "ground_truth", "domain", "sample", "item")


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def _lookup(root: Any, path: list[str]) -> Any:
    value = root
    for part in path:
        if isinstance(value, dict):
            value = value.get(part)
        else:
            value = getattr(value, part, None)
        if value is None:
            return None
    return value


class PromptTemplate:
    """Substitutes ``{{question}}`` (the last user message), ``{{response}}`` (the completion text),
    ``{{ground_truth}}``, ``{{domain}}`` and dotted paths such as ``{{sample.finish_reason}}`` or
    ``{{item.metadata.topic}}``. Other text, including single braces, is left as written."""

    def __init__(self, template: str) -> None:
        self.template = template
        for name in _VAR.findall(template):
            root = name.split(".", 1)[0]
            if root not in TEMPLATE_NAMES:
                raise ValueError(f"unknown variable {{{{{name}}}}}; known: {', '.join(TEMPLATE_NAMES)}")
            if root in ("sample", "item") and "." not in name:
                raise ValueError(f"{{{{{name}}}}} needs a field, e.g. {{{{{root}.metadata}}}}")

    def render(self, sample: Sample, item: Item) -> str:
        """The prompt for one sample."""
        question = sample.prompt_text
        if not question and item.messages:
            users = [m for m in item.messages if m.get("role") == "user"]
            question = _text(users[-1].get("content")) if users else ""
        simple = {"question": question, "response": sample.text, "ground_truth": _text(item.ground_truth),
                  "domain": item.domain}

        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            if name in simple:
                return simple[name]
            root, _, rest = name.partition(".")
            return _text(_lookup(sample if root == "sample" else item, rest.split(".")))

        return _VAR.sub(sub, self.template)
