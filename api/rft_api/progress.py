"""The progress record: what the trainer writes to ConfigMap ``<job>-progress``, key ``progress.json``.

The trainer is the only writer of that ConfigMap (its Role allows get and patch of it and nothing
else); the operator reads it and folds it into ``RFTJob.status``. Both sides use this one model (the
trainer builds and writes it, the operator parses it). The format is documented in
``docs/progress.md``. Rules for readers:

- missing keys take their defaults (a trainer that has not reached a step yet writes ``{}``);
- unknown keys are ignored (newer trainers may add fields);
- wrong types, negative counters, non-finite floats or invalid JSON are refused with
  :class:`ProgressError`, whose message names the offending field.
"""
from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Mapping, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from pydantic.alias_generators import to_camel

from .job import field_path

PROGRESS_KEY = "progress.json"
"""The ConfigMap key (and the file name, on one machine) that holds the record."""
SAMPLES_KEY = "samples.json"
"""The ConfigMap key that holds the last steps' sampled completions (``kubectl rft samples``); the
trainer patches it next to the record."""

MAX_CHECKPOINTS = 10_000
Count = Annotated[int, Field(ge=0)]


class ProgressError(ValueError):
    """The progress ConfigMap holds something that is not a progress record; the message says where."""


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore",
                              allow_inf_nan=False, frozen=True)


class ProgressCheckpoint(_Model):
    step: Count
    """Training step whose state the checkpoint holds."""
    path: Annotated[str, StringConstraints(min_length=1, max_length=1024)]
    """Directory of the checkpoint on the checkpoint volume (e.g. ``/checkpoints/step-000010``)."""
    time: Optional[Annotated[str, StringConstraints(max_length=64)]] = None
    """When the checkpoint became complete (RFC 3339)."""


class ProgressErrors(_Model):
    timeouts: Count = 0
    """Samples whose evaluator timed out (cumulative)."""
    runtime_errors: Count = 0
    """Samples whose evaluator raised (cumulative)."""
    parse_errors: Count = 0
    """Samples from which the evaluator could parse no answer (cumulative)."""
    dropped_episodes: Count = 0
    """Episodes the coordinator dropped as too stale or duplicated (cumulative)."""
    reissued_leases: Count = 0
    """Task leases that expired and were issued again (cumulative)."""
    refused_episodes: Count = 0
    """Episodes the coordinator refused: not from the live lease holder, or invalid (non-finite rewards,
    token ids outside the vocabulary, lengths beyond the limits, another prompt than the group's) (cumulative)."""


class CurvePoint(_Model):
    step: Count
    """The training step."""
    mean: Optional[float] = None
    """Mean reward of the step's samples."""
    std: Optional[float] = None
    """Standard deviation of the step's rewards."""


MAX_CURVE_POINTS = 500


def reward_curve(rows: Sequence[Mapping[str, Any]], max_points: int = MAX_CURVE_POINTS) -> list[CurvePoint]:
    """The reward curve of per-step metric rows (``step``, ``reward_mean``, ``reward_std``): every step
    up to ``max_points``, else evenly spaced steps, always ending with the last one."""
    pts = [CurvePoint(step=int(r["step"]), mean=_finite(r.get("reward_mean")), std=_finite(r.get("reward_std")))
           for r in rows if isinstance(r.get("step"), int) and r["step"] >= 1]  # step 0: the baseline evaluation
    if len(pts) <= max_points:
        return pts
    stride = (len(pts) - 1) / (max_points - 1)
    return [pts[round(i * stride)] for i in range(max_points)]


def _finite(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


class FinalModel(_Model):
    path: Annotated[str, StringConstraints(min_length=1, max_length=1024)]
    """Directory of the trained policy, relative to the checkpoint volume."""
    format: Literal["full", "lora"]
    """``full``: the model in Hugging Face layout with its tokenizer; ``lora``: the adapter with the tokenizer."""
    merged_path: Optional[Annotated[str, StringConstraints(min_length=1, max_length=1024)]] = None
    """The adapter merged into the base model, in Hugging Face layout (``checkpoint.mergeFinalAdapter``)."""


class OutputPush(_Model):
    uri: Annotated[str, StringConstraints(min_length=1, max_length=1024)]
    """Where the final model was pushed (``spec.output.uri``, with its ``final/`` folder on S3)."""
    revision: Optional[Annotated[str, StringConstraints(max_length=256)]] = None
    """The hub commit of the push."""
    files: Count = 0
    bytes: Count = 0
    error: Optional[Annotated[str, StringConstraints(max_length=1024)]] = None
    """Why the push failed (the model stays on the checkpoint volume)."""
    reason: Optional[Annotated[str, StringConstraints(max_length=64)]] = None
    """The failure's reason (Forbidden, NotFound, Unreachable, ...)."""


StopReason = Literal["scoreAtLeast", "patience"]


class EvalPoint(_Model):
    step: Count
    score: float


class ProgressEvaluation(_Model):
    """Held-out evaluation (``spec.evaluation``): the baseline, the last and the best scores."""

    baseline: Optional[float] = None
    """The score before the first training step (``evaluation.atStart``)."""
    step: Optional[Count] = None
    """The step of the last evaluation."""
    score: Optional[float] = None
    """The mean reward of the last evaluation."""
    pass_at_k: Optional[float] = None
    """The share of tasks with a sample scoring at least ``evaluation.passReward`` at the last evaluation."""
    best_step: Optional[Count] = None
    """The step of the best evaluation so far."""
    best_score: Optional[float] = None
    best_checkpoint: Optional[Annotated[str, StringConstraints(max_length=1024)]] = None
    """The checkpoint of the best evaluation (kept beyond ``checkpoint.keepLast`` with ``evaluation.keepBest``)."""
    stop_reason: Optional[StopReason] = None
    """Why training stopped before ``trainer.maxSteps`` (``evaluation.stopWhen``)."""
    curve: list[EvalPoint] = Field(default_factory=list, max_length=MAX_CURVE_POINTS)
    """Every evaluation's score by step (at most 500, evenly spaced)."""


class Progress(_Model):
    """One progress record (all counters cumulative over the whole job, across trainer restarts)."""

    attempt: Count = 0
    """The trainer attempt that wrote the record (env ``RFT_TRAINER_ATTEMPT``)."""
    step: Count = 0
    """Completed training steps."""
    total_steps: Optional[Count] = None
    """Steps the trainer will run (``trainer.maxSteps``)."""
    policy_version: Count = 0
    """Version of the policy weights published to inference."""
    reward_mean: Optional[float] = None
    """Mean reward of the last step's samples."""
    reward_std: Optional[float] = None
    """Standard deviation of the last step's rewards."""
    eval_score: Optional[float] = None
    """Mean reward on the evaluation set at the last evaluation."""
    eval_domain_scores: dict[str, float] = Field(default_factory=dict)
    """Mean reward per task domain at the last evaluation (when the evaluation set has several domains)."""
    samples_scored: Count = 0
    """Samples that reached the evaluator (cumulative); the denominator of the error counters."""
    errors: ProgressErrors = Field(default_factory=ProgressErrors)
    """Error counters (cumulative)."""
    checkpoints: list[ProgressCheckpoint] = Field(default_factory=list, max_length=MAX_CHECKPOINTS)
    """Complete checkpoints retained on the volume."""
    done: bool = False
    """The trainer finished every step and wrote its final checkpoint; it exits 0 next."""
    message: Annotated[str, StringConstraints(max_length=1024)] = ""
    """A short human-readable note (e.g. ``resumed from step 10``)."""
    update_time: Optional[Annotated[str, StringConstraints(max_length=64)]] = None
    """When the record was written (RFC 3339)."""
    reward_curve: list[CurvePoint] = Field(default_factory=list, max_length=MAX_CURVE_POINTS)
    """The reward mean (and spread) per step over the whole job, at most 500 evenly spaced steps
    (``kubectl rft status`` and ``kubectl rft curve`` draw it)."""
    domain_rewards: dict[str, float] = Field(default_factory=dict)
    """Mean reward of the last step's samples per task domain."""
    final_model: Optional[FinalModel] = None
    """Where the trained policy is, once the trainer finished (written with ``done``)."""
    evaluation: Optional[ProgressEvaluation] = None
    """Held-out evaluation (absent until the first evaluation)."""
    output: Optional[OutputPush] = None
    """The push of the final model to ``spec.output`` (absent without it, or before training ends)."""

    def to_data(self) -> dict[str, str]:
        """The ConfigMap ``data`` that carries this record (what a writer patches)."""
        return {PROGRESS_KEY: self.model_dump_json(by_alias=True, exclude_none=True)}


def parse_text(text: str) -> Progress:
    """Parse the JSON text of ``progress.json``; raises :class:`ProgressError` naming the bad field."""
    try:
        return Progress.model_validate_json(text, strict=True)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            where = field_path(tuple(err["loc"]))
            if err["type"] in ("json_invalid", "model_type"):
                problems.append(f"{PROGRESS_KEY}: not a JSON object ({err['msg']})")
            else:
                problems.append(f"{PROGRESS_KEY}: {where}: {err['msg']}")
        raise ProgressError("; ".join(problems)) from None


def parse(data: Optional[dict[str, Any]]) -> Optional[Progress]:
    """Parse a progress ConfigMap's ``data``: ``None`` when the trainer has written nothing yet."""
    if not data or PROGRESS_KEY not in data:
        return None
    text = data[PROGRESS_KEY]
    if not isinstance(text, str):
        raise ProgressError(f"{PROGRESS_KEY}: expected a string of JSON, got {type(text).__name__}")
    if not text.strip():
        return None
    return parse_text(text)
