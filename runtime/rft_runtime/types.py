"""Rollout data types (rLLM's Episode / Trajectory / Step).

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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

__all__ = [
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
# Step / Trajectory / Episode


class Step(_JsonModel):
    """One model call: the prompt sent, the tokens that came back, and how they were scored."""

    prompt_ids: list[StrictInt]
    response_ids: list[StrictInt]
    logprobs: list[float]
    response_mask: list[StrictInt] = Field(
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
        n = len(self.response_ids)
        if not self.prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if any(t < 0 for t in self.prompt_ids):
            raise ValueError("prompt_ids must be non-negative token ids")
        if any(t < 0 for t in self.response_ids):
            raise ValueError("response_ids must be non-negative token ids")
        if len(self.response_mask) != n:
            raise ValueError(f"response_mask has {len(self.response_mask)} entries but response_ids has {n} tokens")
        bad = [v for v in self.response_mask if v not in (0, 1)]
        if bad:
            raise ValueError(f"response_mask values must be 0 or 1, got {bad[0]!r}")
        if len(self.logprobs) != n:
            raise ValueError(
                f"logprobs has {len(self.logprobs)} entries but response_ids has {n} tokens "
                f"({sum(self.response_mask)} sampled): one logprob per response token, 0.0 where response_mask is 0"
            )
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
