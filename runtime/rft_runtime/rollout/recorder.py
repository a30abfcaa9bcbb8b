"""`RolloutRecorder`: every sample a rollout draws, its conversation, and its trajectory.

A chat call whose messages extend a history this recorder returned (same messages, up to and
including one of its assistant messages) continues that sample's `TokenConversation`, so earlier
assistant turns keep their sampled ids. Samples form trajectories: a sample that continues another
joins that sample's trajectory; a second continuation of the same sample (a fork) and a fresh
conversation each start a new one. Every sample is in exactly one trajectory.

Step-wise recording (``stepwise=True``, the recording gateway's calls): a fresh conversation joins
the trajectory named ``trajectory_name`` as a further step instead of starting one, so an agent whose
calls do not continue each other (a summarising agent, a planner and its sub-calls) is one trajectory
of separate steps (rLLM's step-wise trajectory; the trainer trains each step, sharing the
trajectory's advantage).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..types import Sample
from .conversation import TokenConversation
from .errors import TokenContractError

DEFAULT_TRAJECTORY = "default"


def message_key(message: Any) -> str:
    """Canonical text of a chat message (dict, or an object with attributes such as ours)."""
    role = _field(message, "role")
    content = _content_text(_field(message, "content")) or ""  # None and "" are the same empty reply
    key: dict[str, Any] = {"role": role, "content": content}
    calls = _field(message, "tool_calls")
    if calls:
        key["tool_calls"] = [
            [_field(_field(c, "function"), "name"), _field(_field(c, "function"), "arguments")] for c in calls
        ]
    for extra in ("name", "tool_call_id"):
        v = _field(message, extra)
        if v is not None:
            key[extra] = v
    return json.dumps(key, sort_keys=True, ensure_ascii=False)


def message_dict(message: Any) -> dict[str, Any]:
    """A plain chat-message dict from a dict or a message object (for templates and history)."""
    if isinstance(message, Mapping):
        return dict(message)
    dump = getattr(message, "model_dump", None)
    if callable(dump):
        d = dump(exclude_none=True)
        return {k: v for k, v in d.items() if k in ("role", "content", "tool_calls", "name", "tool_call_id")}
    raise TypeError(f"a chat message must be a dict or a message object, got {type(message).__name__}")


def _field(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _content_text(content: Any) -> Any:
    if isinstance(content, list):  # content parts: keep only text parts, in order
        return "".join(str(_field(p, "text") or "") for p in content if _field(p, "type") in ("text", None))
    return content


@dataclass
class RecordedSample:
    """One sample with its place: `conversation` is the history after this sample's turn."""

    index: int
    sample: Sample
    conversation: TokenConversation
    message: dict[str, Any]
    parent: int | None
    trajectory: int
    history: tuple[str, ...]
    turn: int = 1
    """Which assistant turn of its conversation this sample is (1 for a new conversation)."""


@dataclass
class RecordedTrajectory:
    """A chain of samples, each continuing the previous one."""

    name: str
    samples: list[RecordedSample] = field(default_factory=list)

    def flat(self) -> tuple[list[int], list[int], list[int], list[float]]:
        """`(prompt_ids, response_ids, response_mask, response_logprobs)` of the whole chain.

        The prompt is the first sample's prompt; the response holds every later token up to the last
        sampled one, mask 1 on sampled tokens and 0 on template/environment tokens.
        """
        first, last = self.samples[0], self.samples[-1]
        start = len(first.sample.prompt_ids)
        conv = last.conversation
        if conv.ids[:start] != first.sample.prompt_ids:
            raise TokenContractError("trajectory's first prompt is not a prefix of its conversation")
        return conv.response_view(start)


class RolloutRecorder:
    """Collects the samples of one rollout (one episode)."""

    def __init__(self) -> None:
        self.samples: list[RecordedSample] = []
        self.trajectories: list[RecordedTrajectory] = []
        self._by_history: dict[tuple[str, ...], list[int]] = {}
        self._by_message_obj: dict[int, int] = {}
        self._continued: set[int] = set()
        self._returned_objects: list[Any] = []  # keeps ids in _by_message_obj valid

    def find(self, messages: Sequence[Any]) -> tuple[RecordedSample, int] | None:
        """The recorded sample whose history is the longest prefix of `messages` ending at one of its
        assistant messages, and the length of that prefix; None when there is none."""
        keys = [message_key(m) for m in messages]
        for k in range(len(messages), 0, -1):
            if _field(messages[k - 1], "role") != "assistant":
                continue
            candidates = self._by_history.get(tuple(keys[:k]))
            if not candidates:
                continue
            by_obj = self._by_message_obj.get(id(messages[k - 1]))
            if by_obj in candidates:
                return self.samples[by_obj], k
            fresh = [i for i in candidates if i not in self._continued]
            return self.samples[(fresh or candidates)[0]], k
        return None

    def record(
        self,
        sample: Sample,
        conversation: TokenConversation,
        *,
        message: dict[str, Any],
        message_obj: Any,
        history: Sequence[Any],
        parent: RecordedSample | None,
        trajectory_name: str,
        stepwise: bool = False,
    ) -> RecordedSample:
        """Record `sample`; `history` is the request's messages (the new assistant message excluded)."""
        index = len(self.samples)
        if parent is not None and parent.index not in self._continued:
            self._continued.add(parent.index)
            traj = parent.trajectory
        elif parent is None and stepwise and (named := self._named(trajectory_name)) is not None:
            traj = named
        else:
            self.trajectories.append(RecordedTrajectory(self._unique_name(trajectory_name)))
            traj = len(self.trajectories) - 1
        key = tuple(message_key(m) for m in history) + (message_key(message),)
        rec = RecordedSample(index, sample, conversation, message, None if parent is None else parent.index, traj, key,
                             turn=1 if parent is None else parent.turn + 1)
        self.samples.append(rec)
        self.trajectories[traj].samples.append(rec)
        self._by_history.setdefault(key, []).append(index)
        self._by_message_obj[id(message_obj)] = index
        self._returned_objects.append(message_obj)
        return rec

    def _named(self, name: str) -> int | None:
        """The index of the trajectory called ``name`` (None when there is none)."""
        return next((i for i, t in enumerate(self.trajectories) if t.name == name), None)

    def _unique_name(self, name: str) -> str:
        """`name`, or `name#k` (smallest k >= 1 not taken): names are unique within an episode."""
        taken = {t.name for t in self.trajectories}
        if name not in taken:
            return name
        k = 1
        while f"{name}#{k}" in taken:
            k += 1
        return f"{name}#{k}"
