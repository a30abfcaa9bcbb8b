"""Rollout data types: one sampled completion (:class:`Sample`) and rLLM's Episode / Trajectory / Step.

Token contract (contract 1 in docs/architecture.md), as enforced by :class:`Step`:

- ``prompt_ids``: the exact token ids sent to the engine (non-empty).
- ``response_ids``: every token after the prompt, in order. Sampled tokens have
  ``response_mask`` 1; tokens the model did not sample (tool or environment output appended
  between turns) have mask 0.
- ``logprobs``: **one entry per response token**, aligned with ``response_ids``: the engine's
  processed logprob (after temperature) where the mask is 1, and exactly ``0.0`` where it is 0.
  So ``len(logprobs) == len(response_ids) == len(response_mask)``, and the number of sampled
  tokens is ``sum(response_mask)``. Logprobs are finite and ``<= 0``.
- ``policy_version``: the version of the weights that sampled the step.

Violations raise :class:`pydantic.ValidationError` (a ``ValueError``) naming the field; nothing is
padded or truncated silently. Every model round-trips exactly through JSON
(``to_json`` / ``from_json``, or pydantic's ``model_dump_json`` / ``model_validate_json``) as long
as ``metadata`` holds JSON values.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

__all__ = [
    "Sample",
    "Step",
    "Trajectory",
    "Episode",
    "ErrorFlags",
    "TerminationReason",
    "episode_id",
    "parse_episode_id",
    "group_key",
]

LOGPROB_TOLERANCE = 1e-6  # a processed logprob may round to a hair above 0


class _JsonModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    def to_json(self) -> str:
        """Serialise to JSON (exact round trip with :meth:`from_json`)."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, data: str | bytes):  # type: ignore[no-untyped-def]
        """Parse JSON produced by :meth:`to_json`; validates every invariant."""
        return cls.model_validate_json(data)


# ----------------------------------------------------------------------------------------------
# Sample


class _Mappable:
    """Lets evaluators written for dicts read a dataclass: ``sample["text"]``, ``sample.get(...)``."""

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


def _content_text(content: Any) -> str:
    """The text of a chat message's content (a string or a list of ``{"type": "text"}`` parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _int_list(value: Any, name: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"sample: field {name!r} must be a list of integer token ids")
    return list(value)


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


@dataclass
class Sample(_Mappable):
    """One sampled completion, the same object from the engine to the reward.

    The rollout processor builds it from the engine's response (``rft_runtime.rollout.sampling.
    engine_sample`` checks the token contract: ``logprobs`` aligned with ``completion_ids``, finish
    reason ``stop``/``length``); the recorder keeps it with its place in the conversation; the
    evaluator's ``score(sample, item)`` receives a copy with the conversation filled in
    (``messages``, ``text`` of the final reply, ``id`` the episode id, ``output`` what the bundle's
    ``rollout`` returned); the reward role receives its JSON form (:meth:`to_wire`).

    ``text`` is for display and scoring; it is never re-tokenised. ``truncated`` is True when the
    engine stopped at ``max_tokens`` (finish reason ``length``).
    """

    text: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    truncated: bool = False
    id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    logprobs: list[float] = field(default_factory=list)
    """The engine's processed logprob of each completion token (empty outside the rollout role)."""
    policy_version: int | None = None
    """The policy version the engine reported for this sample (else the one the lease granted)."""
    seed: int | None = None
    stop_reason: int | str | None = None
    server: str = ""
    """The inference endpoint that produced it."""
    output: Any = None
    """What the bundle's ``rollout`` returned (for its own ``score``); not sent to the reward role."""

    @property
    def prompt_text(self) -> str:
        """The last user message before the final assistant turn ('' when there is none)."""
        msgs = self.messages[:-1] if self.messages and self.messages[-1].get("role") == "assistant" else self.messages
        for m in reversed(msgs):
            if m.get("role") == "user":
                return _content_text(m.get("content"))
        return ""

    def to_wire(self) -> dict[str, Any]:
        """The JSON form the reward role reads (contract 3): the fields an evaluator scores on."""
        return {"id": self.id, "text": self.text, "messages": [dict(m) for m in self.messages],
                "prompt_ids": list(self.prompt_ids), "completion_ids": list(self.completion_ids),
                "finish_reason": self.finish_reason, "truncated": bool(self.truncated),
                "metadata": dict(self.metadata)}

    @classmethod
    def from_any(cls, obj: Any) -> "Sample":
        """A Sample from a Sample, a dict (the wire form) or any object with the same field names.

        ``text`` defaults to the final assistant message of ``messages``; ``response_ids`` is accepted
        for ``completion_ids``. Raises ValueError naming the bad field.
        """
        if isinstance(obj, Sample):
            return obj
        if isinstance(obj, str):
            return cls(text=obj, messages=[{"role": "assistant", "content": obj}])
        messages = _field(obj, "messages") or []
        if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
            raise ValueError("sample: field 'messages' must be a list of chat messages (objects)")
        messages = [dict(m) for m in messages]
        text = _field(obj, "text")
        if text is None:
            last = messages[-1] if messages else None
            text = _content_text(last.get("content")) if last and last.get("role") == "assistant" else ""
        if not isinstance(text, str):
            raise ValueError("sample: field 'text' must be a string")
        if not messages:
            messages = [{"role": "assistant", "content": text}]
        completion = _field(obj, "completion_ids")
        if completion is None:
            completion = _field(obj, "response_ids")
        finish = _field(obj, "finish_reason")
        if finish is not None and not isinstance(finish, str):
            raise ValueError("sample: field 'finish_reason' must be a string or null")
        metadata = _field(obj, "metadata") or {}
        if not isinstance(metadata, Mapping):
            raise ValueError("sample: field 'metadata' must be an object")
        sid = _field(obj, "id")
        return cls(
            text=text,
            messages=messages,
            prompt_ids=_int_list(_field(obj, "prompt_ids"), "prompt_ids"),
            completion_ids=_int_list(completion, "completion_ids"),
            finish_reason=finish,
            truncated=bool(_field(obj, "truncated", False)),
            id=None if sid is None else str(sid),
            metadata=dict(metadata),
        )


# ----------------------------------------------------------------------------------------------
# Step / Trajectory / Episode


class Step(_JsonModel):
    """One model call: the prompt sent, the tokens that came back, and how they were scored."""

    prompt_ids: list[StrictInt]
    response_ids: list[StrictInt]
    logprobs: list[float]
    response_mask: list[StrictInt] = Field(  # type: ignore[call-overload]  # None: the before-validator fills it
        default=None, validate_default=False,
        description="1 = sampled by the model, 0 = tool/environment token; defaults to all 1",
    )
    policy_version: StrictInt | None = Field(
        default=None, description="version of the weights that sampled the step (rLLM: weight_version)")
    reward: float | None = None
    done: bool = False
    finish_reason: str | None = None
    truncated: bool = False
    messages: list[dict[str, Any]] = Field(default_factory=list,
                                           description="chat messages that produced prompt_ids")
    response_text: str | None = Field(default=None, description="the engine's text of the response")
    metadata: dict[str, Any] = Field(default_factory=dict)
    # rLLM's Step fields, kept as written (an rLLM episode round-trips through these types)
    weight_version: StrictInt | None = None
    chat_completions: list[dict[str, Any]] = Field(default_factory=list)
    observation: Any = None
    thought: str = ""
    action: Any = None
    model_response: str = ""
    model_output: dict[str, Any] | None = None
    info: dict[str, Any] = Field(default_factory=dict)
    mc_return: float = 0.0
    advantage: float | list[float] | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_mask(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("response_mask") is None and isinstance(data.get("response_ids"), list):
            data = {**data, "response_mask": [1] * len(data["response_ids"])}
        return data

    @model_validator(mode="after")
    def _check_lengths(self) -> "Step":
        # Every episode a coordinator takes passes here: each check is one pass in C (min, set, sum), and
        # only a list that fails one is walked in Python to name its first bad entry.
        n = len(self.response_ids)
        if not self.prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if min(self.prompt_ids) < 0:
            raise ValueError("prompt_ids must be non-negative token ids")
        if self.response_ids and min(self.response_ids) < 0:
            raise ValueError("response_ids must be non-negative token ids")
        if len(self.response_mask) != n:
            raise ValueError(f"response_mask has {len(self.response_mask)} entries but response_ids has {n} tokens")
        if not set(self.response_mask) <= {0, 1}:
            bad = next(v for v in self.response_mask if v not in (0, 1))
            raise ValueError(f"response_mask values must be 0 or 1, got {bad!r}")
        if len(self.logprobs) != n:
            raise ValueError(
                f"logprobs has {len(self.logprobs)} entries but response_ids has {n} tokens "
                f"({sum(self.response_mask)} sampled): one logprob per response token, 0.0 where response_mask is 0"
            )
        # a finite sum has no infinite or NaN term; only a list that may hold a bad one is walked
        if self.logprobs and (not math.isfinite(sum(self.logprobs)) or max(self.logprobs) > LOGPROB_TOLERANCE
                              or 0 in self.response_mask):
            for i, (lp, m) in enumerate(zip(self.logprobs, self.response_mask)):
                if not math.isfinite(lp) or lp > LOGPROB_TOLERANCE:
                    raise ValueError(f"logprobs[{i}] = {lp!r}: logprobs must be finite and <= 0")
                if m == 0 and lp != 0.0:
                    raise ValueError(f"logprobs[{i}] = {lp!r} but response_mask[{i}] is 0: "
                                     "non-sampled tokens carry logprob 0.0")
        if self.policy_version is None:
            self.policy_version = self.weight_version
        elif self.weight_version is None:
            self.weight_version = self.policy_version
        elif self.weight_version != self.policy_version:
            raise ValueError(f"policy_version {self.policy_version} and weight_version {self.weight_version} differ")
        if self.policy_version is not None and self.policy_version < 0:
            raise ValueError(f"policy_version must be >= 0, got {self.policy_version}")
        if isinstance(self.advantage, list) and len(self.advantage) != n:
            raise ValueError(f"advantage has {len(self.advantage)} entries but response_ids has {n} tokens")
        return self

    @property
    def num_sampled_tokens(self) -> int:
        """Tokens the model sampled (``sum(response_mask)``)."""
        return sum(self.response_mask)

    def sampled_logprobs(self) -> list[float]:
        """Logprobs of the sampled (mask 1) tokens only, in order."""
        return [lp for lp, m in zip(self.logprobs, self.response_mask) if m]

    @property
    def full_ids(self) -> list[int]:
        """``prompt_ids + response_ids``."""
        return self.prompt_ids + self.response_ids


class Trajectory(_JsonModel):
    """A sequence of steps of one agent (``name``) within an episode, with its reward.

    Multi-turn continuity: when step ``i+1`` continues step ``i``, its ``prompt_ids`` start with
    step ``i``'s ``prompt_ids + response_ids`` (token ids are appended, never re-tokenised).
    """

    name: str = "default"
    steps: list[Step] = Field(default_factory=list)
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    # rLLM's Trajectory fields
    uid: str = Field(default_factory=lambda: str(uuid.uuid4()))
    task: Any = None
    info: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_name(self) -> "Trajectory":
        if not self.name:
            raise ValueError("trajectory name must not be empty")
        return self

    def segments(self) -> list[Step]:
        """The trajectory's training samples: its steps grouped into chains, each merged
        (:meth:`merged`) into one step.

        A step joins the latest chain whose context (last prompt + response) its prompt extends; a step
        that extends none starts a chain. A cumulative multi-turn trajectory is one chain (one masked
        sequence); rLLM's step-wise trajectory (separate calls, e.g. a summarising agent) is one chain per
        call, each trained as its own sample with the trajectory's advantage.
        """
        if not self.steps:
            raise ValueError(f"trajectory {self.name!r} has no steps")
        chains: list[list[Step]] = []
        contexts: list[list[int]] = []
        for step in self.steps:
            k = next((k for k in range(len(chains) - 1, -1, -1)
                      if step.prompt_ids[: len(contexts[k])] == contexts[k]), None)
            if k is None:
                chains.append([step])
                contexts.append(step.prompt_ids + step.response_ids)
            else:
                chains[k].append(step)
                contexts[k] = step.prompt_ids + step.response_ids
        if len(chains) == 1:
            return [self.merged()]
        return [Trajectory(name=self.name, steps=c, reward=self.reward).merged() for c in chains]

    def merged(self) -> Step:
        """The trajectory as one step: the first prompt, then every response and the environment
        tokens between turns (mask 0, logprob 0.0) in order.

        Raises ``ValueError`` when a step's prompt does not extend the previous step's
        prompt + response. The merged ``policy_version`` is the oldest of the steps (all of them
        are in ``metadata["policy_versions"]``); finish reason, truncation, done and text are the
        last step's; reward is the trajectory's.
        """
        if not self.steps:
            raise ValueError(f"trajectory {self.name!r} has no steps")
        first = self.steps[0]
        response: list[int] = list(first.response_ids)
        mask: list[int] = list(first.response_mask)
        logprobs: list[float] = list(first.logprobs)
        context = first.prompt_ids + first.response_ids
        for i, step in enumerate(self.steps[1:], start=1):
            if step.prompt_ids[: len(context)] != context:
                pos = next((j for j, (a, b) in enumerate(zip(step.prompt_ids, context)) if a != b),
                           min(len(step.prompt_ids), len(context)))
                raise ValueError(
                    f"trajectory {self.name!r}: steps[{i}].prompt_ids does not extend steps[{i - 1}]'s "
                    f"prompt + response (first difference at position {pos})"
                )
            env = step.prompt_ids[len(context):]
            response += env + step.response_ids
            mask += [0] * len(env) + step.response_mask
            logprobs += [0.0] * len(env) + step.logprobs
            context = step.prompt_ids + step.response_ids
        last = self.steps[-1]
        return Step(
            prompt_ids=list(first.prompt_ids),
            response_ids=response,
            logprobs=logprobs,
            response_mask=mask,
            policy_version=min((s.policy_version for s in self.steps if s.policy_version is not None), default=None),
            reward=self.reward,
            done=last.done,
            finish_reason=last.finish_reason,
            truncated=last.truncated,
            messages=list(first.messages),
            response_text=last.response_text,
            metadata={"policy_versions": [s.policy_version for s in self.steps], "merged_steps": len(self.steps)},
        )


TerminationReason = Literal[
    "stop", "length", "env_done", "max_turns", "timeout", "error", "aborted", "unknown",
    # rLLM's TerminationReason values
    "max_prompt_length_exceeded", "max_response_length_exceeded", "max_turns_exceeded",
]


class ErrorFlags(_JsonModel):
    """What went wrong in a rollout or its scoring (Reward API error flags plus rollout errors)."""

    timeout: bool = False
    runtime_error: bool = False
    parse_error: bool = False
    rollout_error: bool = False
    message: str | None = None

    @property
    def any(self) -> bool:
        """True when any flag is set."""
        return self.timeout or self.runtime_error or self.parse_error or self.rollout_error


def episode_id(task_id: str, rollout_idx: int) -> str:
    """rLLM's episode id: ``"{task_id}:{rollout_idx}"``."""
    return f"{task_id}:{rollout_idx}"


def parse_episode_id(eid: str) -> tuple[str, int]:
    """Inverse of :func:`episode_id` (task ids may themselves contain ``:``)."""
    task_id, sep, idx = eid.rpartition(":")
    if not sep or not task_id or not idx.isdigit():
        raise ValueError(f"episode id {eid!r} is not of the form '<task_id>:<rollout_idx>'")
    return task_id, int(idx)


class Episode(_JsonModel):
    """One rollout of one task: its trajectories, correctness, metrics and error flags."""

    id: str = ""
    task_id: str
    rollout_idx: StrictInt
    trajectories: list[Trajectory] = Field(default_factory=list)
    task: Any = None
    info: dict[str, Any] = Field(default_factory=dict)
    is_correct: bool | None = None
    reward_reason: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    termination_reason: TerminationReason | None = None
    errors: ErrorFlags = Field(default_factory=ErrorFlags)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _ids_from_id(cls, data: Any) -> Any:
        """rLLM writes only ``id`` (``"{task_id}:{rollout_idx}"``); derive the other two from it."""
        if isinstance(data, dict) and data.get("id") and ("task_id" not in data or "rollout_idx" not in data):
            try:
                task_id, idx = parse_episode_id(data["id"])
            except ValueError:
                return data
            data = {"task_id": task_id, "rollout_idx": idx, **data}
        return data

    @model_validator(mode="after")
    def _check_id(self) -> "Episode":
        if not self.task_id:
            raise ValueError("task_id must not be empty")
        if self.rollout_idx < 0:
            raise ValueError(f"rollout_idx must be >= 0, got {self.rollout_idx}")
        expected = episode_id(self.task_id, self.rollout_idx)
        if not self.id:
            self.id = expected
        elif self.id != expected:
            raise ValueError(f"id {self.id!r} does not match '{{task_id}}:{{rollout_idx}}' = {expected!r}")
        return self

    def trajectory(self, name: str | None = None) -> Trajectory:
        """The (first) trajectory called ``name``; default: ``"default"`` if present, else the first.
        Names may repeat (rLLM: several trajectories of one agent); they share an advantage group."""
        if not self.trajectories:
            raise ValueError(f"episode {self.id!r} has no trajectories")
        if name is None:
            name = "default" if any(t.name == "default" for t in self.trajectories) else self.trajectories[0].name
        for t in self.trajectories:
            if t.name == name:
                return t
        raise KeyError(f"episode {self.id!r} has no trajectory {name!r}; it has {[t.name for t in self.trajectories]}")

    @property
    def reward(self) -> float | None:
        """The main trajectory's reward (see :meth:`trajectory`); None without trajectories."""
        return self.trajectory().reward if self.trajectories else None


def group_key(episode: Episode, trajectory: Trajectory) -> str:
    """Advantage grouping key: ``"{task_id}:{trajectory.name}"``."""
    return f"{episode.task_id}:{trajectory.name}"
