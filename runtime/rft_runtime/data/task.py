"""The unit of work of a dataset: one prompt with its ground truth."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Task", "DatasetError", "TOO_DEEP"]

TOO_DEEP = "JSON nested deeper than the parser allows (a row is a task: a prompt, an answer, metadata)"


class DatasetError(ValueError):
    """A dataset (file, builtin options or task) is malformed; the message names the field."""


def _check_messages(messages: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise DatasetError(f"{where}: field 'messages' must be a non-empty list of chat messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise DatasetError(f"{where}: field 'messages[{i}]' must be an object, got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise DatasetError(f"{where}: field 'messages[{i}].role' must be a non-empty string")
        content = m.get("content")
        if not isinstance(content, (str, list)) and not (content is None and m.get("tool_calls")):
            raise DatasetError(f"{where}: field 'messages[{i}].content' must be a string or a list of parts")
    return messages


@dataclass(frozen=True)
class Task:
    """One prompt of a dataset.

    Exactly one of ``messages`` (OpenAI chat messages) or ``prompt`` (a user turn as plain text)
    is set. ``ground_truth`` is any JSON value the evaluator understands (builtin datasets use the
    answer as a string, e.g. ``"42"``). ``domain`` names the reward domain for mixing and
    per-domain metrics. ``metadata`` must be JSON-serialisable.
    """

    task_id: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    ground_truth: Any = None
    domain: str = "default"
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"task {self.task_id!r}"
        if not isinstance(self.task_id, str) or not self.task_id:
            raise DatasetError(f"task: field 'task_id' must be a non-empty string, got {self.task_id!r}")
        if (self.messages is None) == (self.prompt is None):
            raise DatasetError(f"{where}: exactly one of 'messages' or 'prompt' must be set")
        if self.messages is not None:
            _check_messages(self.messages, where)
        if self.prompt is not None and not isinstance(self.prompt, str):
            raise DatasetError(f"{where}: field 'prompt' must be a string")
        if not isinstance(self.domain, str) or not self.domain:
            raise DatasetError(f"{where}: field 'domain' must be a non-empty string")
        if not isinstance(self.metadata, dict):
            raise DatasetError(f"{where}: field 'metadata' must be an object")

    def chat_messages(self) -> list[dict[str, Any]]:
        """The prompt as chat messages (a ``prompt`` becomes one user message). Returns a copy."""
        if self.messages is not None:
            return [dict(m) for m in self.messages]
        return [{"role": "user", "content": self.prompt}]

    def with_domain(self, domain: str) -> "Task":
        """A copy of this task with another domain."""
        return dataclasses.replace(self, domain=domain)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the JSONL row format, plus ``task_id`` and ``domain``)."""
        d: dict[str, Any] = {"task_id": self.task_id}
        if self.messages is not None:
            d["messages"] = [dict(m) for m in self.messages]
        else:
            d["prompt"] = self.prompt
        d["ground_truth"] = self.ground_truth
        d["domain"] = self.domain
        d["metadata"] = dict(self.metadata)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Task":
        """Inverse of :meth:`to_dict`."""
        return cls(
            task_id=d["task_id"],
            messages=d.get("messages"),
            prompt=d.get("prompt"),
            ground_truth=d.get("ground_truth"),
            domain=d.get("domain", "default"),
            metadata=dict(d.get("metadata") or {}),
        )
