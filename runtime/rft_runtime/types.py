"""Rollout data types (rLLM's Episode / Trajectory / Step) and an Eval-Protocol-shaped row view.

Token contract (DESIGN.md, contract 1), as enforced by :class:`Step`:

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
from typing import Any, Literal, Mapping, Sequence

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
    "Message",
    "MetricResult",
    "EvaluateResult",
    "InputMetadata",
    "ExecutionMetadata",
    "EvaluationRow",
    "RowScore",
    "to_evaluation_row",
    "read_evaluation_result",
    "apply_evaluation_result",
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
    policy_version: StrictInt
    reward: float | None = None
    done: bool = False
    finish_reason: str | None = None
    truncated: bool = False
    messages: list[dict[str, Any]] = Field(default_factory=list,
                                           description="chat messages that produced prompt_ids")
    response_text: str | None = Field(default=None, description="the engine's text of the response")
    metadata: dict[str, Any] = Field(default_factory=dict)

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
        if self.policy_version < 0:
            raise ValueError(f"policy_version must be >= 0, got {self.policy_version}")
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
            policy_version=min(s.policy_version for s in self.steps),
            reward=self.reward,
            done=last.done,
            finish_reason=last.finish_reason,
            truncated=last.truncated,
            messages=list(first.messages),
            response_text=last.response_text,
            metadata={"policy_versions": [s.policy_version for s in self.steps], "merged_steps": len(self.steps)},
        )


TerminationReason = Literal["stop", "length", "env_done", "max_turns", "timeout", "error", "aborted", "unknown"]


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
    is_correct: bool | None = None
    reward_reason: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    termination_reason: TerminationReason | None = None
    errors: ErrorFlags = Field(default_factory=ErrorFlags)
    metadata: dict[str, Any] = Field(default_factory=dict)

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
        names = [t.name for t in self.trajectories]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"trajectory names must be unique within an episode, duplicated: {dup}")
        return self

    def trajectory(self, name: str | None = None) -> Trajectory:
        """The trajectory called ``name``; default: ``"default"`` if present, else the first."""
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


# ----------------------------------------------------------------------------------------------
# Eval-Protocol-shaped row view


class _RowModel(BaseModel):
    model_config = ConfigDict(extra="allow")


class Message(_RowModel):
    """A chat message (OpenAI shape); unknown fields are kept."""

    role: str
    content: str | list[Any] | None = ""


class MetricResult(_RowModel):
    """One component metric of an evaluation."""

    score: float
    reason: str = ""
    is_score_valid: bool = True


class EvaluateResult(_RowModel):
    """An evaluator's verdict: overall score, reason, component metrics, optional error."""

    score: float
    is_score_valid: bool = True
    reason: str | None = None
    metrics: dict[str, MetricResult] = Field(default_factory=dict)
    error: str | None = None


class InputMetadata(_RowModel):
    """Where the row came from."""

    row_id: str | None = None
    dataset_info: dict[str, Any] | None = None


class ExecutionMetadata(_RowModel):
    """How the row was produced; ``extra`` carries the token contract per sample."""

    rollout_id: str | None = None
    finish_reason: str | None = None
    extra: dict[str, Any] | None = None


class EvaluationRow(_RowModel):
    """Eval Protocol's row: messages, ground truth, evaluation result, execution metadata.

    ``execution_metadata.extra`` holds lists with one entry per sample: ``prompt_ids``,
    ``completion_ids``, ``completion_masks``, ``inference_logprobs`` (aligned with completion ids,
    0.0 on mask-0 tokens), ``completions_text``, ``truncated``, ``finish_reasons``,
    ``policy_versions``, ``episode_ids`` and ``rewards``.
    """

    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    input_metadata: InputMetadata = Field(default_factory=InputMetadata)
    ground_truth: Any = None
    evaluation_result: EvaluateResult | None = None
    execution_metadata: ExecutionMetadata = Field(default_factory=ExecutionMetadata)

    def last_assistant_message(self) -> Message | None:
        """The last assistant message, if any."""
        return next((m for m in reversed(self.messages) if m.role == "assistant"), None)


def _item_messages_and_truth(item: Any) -> tuple[list[dict[str, Any]], Any, str | None]:
    if isinstance(item, Mapping):
        if "messages" in item and item["messages"] is not None:
            msgs = [dict(m) for m in item["messages"]]
        elif "prompt" in item and item["prompt"] is not None:
            msgs = [{"role": "user", "content": item["prompt"]}]
        else:
            msgs = []
        return msgs, item.get("ground_truth"), item.get("task_id")
    return item.chat_messages(), getattr(item, "ground_truth", None), getattr(item, "task_id", None)


def _evaluate_result_of(ep: Episode, traj: Trajectory) -> EvaluateResult | None:
    if traj.reward is None:
        return None
    return EvaluateResult(
        score=traj.reward,
        reason=ep.reward_reason,
        metrics={k: MetricResult(score=v) for k, v in ep.metrics.items()},
        error=ep.errors.message if ep.errors.any else None,
    )


def to_evaluation_row(episodes: Episode | Sequence[Episode], item: Any, *,
                      trajectory_name: str | None = None) -> EvaluationRow:
    """The Eval Protocol row view of one episode (a sample) or of a group of episodes of one task.

    ``item`` is the dataset row: a :class:`rft_runtime.data.Task` or a mapping with ``messages`` or
    ``prompt`` and ``ground_truth``. ``messages`` is the first sample's conversation (its last
    step's ``messages``, else the item's) followed by an assistant message with its last response
    text. ``evaluation_result`` is set from the first sample's reward when it has one (for a single
    episode this is the episode's verdict). Per-sample token data is in
    ``execution_metadata.extra`` (see :class:`EvaluationRow`). Each sample uses the trajectory
    ``trajectory_name`` (default: see :meth:`Episode.trajectory`), merged over its steps.
    """
    group = [episodes] if isinstance(episodes, Episode) else list(episodes)
    if not group:
        raise ValueError("to_evaluation_row needs at least one episode")
    item_msgs, truth, item_task_id = _item_messages_and_truth(item)
    task_ids = {e.task_id for e in group}
    if len(task_ids) != 1 or (item_task_id is not None and item_task_id not in task_ids):
        raise ValueError(f"episodes and item must share one task_id; got episodes {sorted(task_ids)}, item {item_task_id!r}")
    trajs = [e.trajectory(trajectory_name) for e in group]
    merged = [t.merged() for t in trajs]
    extra = {
        "prompt_ids": [m.prompt_ids for m in merged],
        "completion_ids": [m.response_ids for m in merged],
        "completion_masks": [m.response_mask for m in merged],
        "inference_logprobs": [m.logprobs for m in merged],
        "completions_text": [m.response_text or "" for m in merged],
        "truncated": [m.truncated for m in merged],
        "finish_reasons": [m.finish_reason for m in merged],
        "policy_versions": [m.policy_version for m in merged],
        "episode_ids": [e.id for e in group],
        "rewards": [t.reward for t in trajs],
    }
    first_last_step = trajs[0].steps[-1]
    convo = [dict(m) for m in first_last_step.messages] if first_last_step.messages else item_msgs
    messages = [Message.model_validate(m) for m in convo]
    messages.append(Message(role="assistant", content=merged[0].response_text or ""))
    single = len(group) == 1
    return EvaluationRow(
        messages=messages,
        ground_truth=truth,
        input_metadata=InputMetadata(row_id=group[0].id if single else group[0].task_id),
        evaluation_result=_evaluate_result_of(group[0], trajs[0]),
        execution_metadata=ExecutionMetadata(
            rollout_id=group[0].id if single else None,
            finish_reason=merged[0].finish_reason,
            extra=extra,
        ),
    )


class RowScore(_JsonModel):
    """A score read back from a row: ``score`` None means not applicable (or invalid)."""

    score: float | None
    reason: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    error: str | None = None


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def read_evaluation_result(row: Any) -> RowScore:
    """Read the verdict of a row an evaluator filled in.

    Accepts our :class:`EvaluationRow`, a plain dict of the same shape, or any object with an
    ``evaluation_result`` attribute (e.g. Eval Protocol's own row). No result, or
    ``is_score_valid`` false, gives ``score=None``. Metric values become floats.
    """
    result = _get(row, "evaluation_result")
    if result is None:
        return RowScore(score=None)
    score = _get(result, "score")
    valid = _get(result, "is_score_valid", True)
    metrics: dict[str, float] = {}
    for name, m in (_get(result, "metrics") or {}).items():
        value = m if isinstance(m, (int, float)) else _get(m, "score")
        if isinstance(value, (int, float)) and _get(m, "is_score_valid", True) is not False:
            metrics[name] = float(value)
    return RowScore(
        score=float(score) if valid is not False and isinstance(score, (int, float)) else None,
        reason=_get(result, "reason"),
        metrics=metrics,
        error=_get(result, "error"),
    )


def apply_evaluation_result(episode: Episode, row: Any, *, trajectory_name: str | None = None) -> Episode:
    """A copy of ``episode`` with the row's verdict: the trajectory reward, reason and metrics."""
    verdict = read_evaluation_result(row)
    ep = episode.model_copy(deep=True)
    ep.trajectory(trajectory_name).reward = verdict.score
    ep.reward_reason = verdict.reason
    ep.metrics = {**ep.metrics, **verdict.metrics}
    if verdict.error:
        ep.errors = ep.errors.model_copy(update={"runtime_error": True, "message": verdict.error})
    return ep
