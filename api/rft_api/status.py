"""RFTJob status, written only by the operator."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, StringConstraints

from .constants import ConditionType, Phase
from .spec import ApiModel

Text = Annotated[str, StringConstraints(max_length=32768)]
Short = Annotated[str, StringConstraints(max_length=1024)]
Time = Annotated[str, StringConstraints(max_length=64)]


class Condition(ApiModel):
    type: ConditionType
    """Condition type."""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown."""
    reason: Annotated[str, StringConstraints(max_length=1024, pattern=r"^([A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?)?$")] = ""
    """CamelCase reason for the last transition."""
    message: Text = ""
    """Human-readable detail."""
    last_transition_time: Optional[Time] = None
    """When status last changed (RFC 3339)."""
    observed_generation: Optional[int] = Field(None, ge=0)
    """The spec generation this condition was computed from."""


class RoleStatus(ApiModel):
    ready: int = Field(0, ge=0)
    """Ready replicas."""
    desired: int = Field(0, ge=0)
    """Desired replicas."""


class RolesStatus(ApiModel):
    inference: RoleStatus = Field(default_factory=RoleStatus)
    """Inference replicas."""
    reward: RoleStatus = Field(default_factory=RoleStatus)
    """Reward replicas."""
    rollout: RoleStatus = Field(default_factory=RoleStatus)
    """Rollout replicas."""
    trainer: RoleStatus = Field(default_factory=RoleStatus)
    """Trainer pods."""


class CheckpointRecord(ApiModel):
    step: int = Field(..., ge=0)
    """Training step of the checkpoint."""
    path: Short
    """Directory of the checkpoint on the checkpoint volume."""
    time: Optional[Time] = None
    """When it was completed."""


class FinalModelRecord(ApiModel):
    claim: Short
    """The PersistentVolumeClaim that holds it (the checkpoint claim)."""
    path: Short
    """Directory of the trained policy on that claim."""
    format: Literal["full", "lora"]
    """full: the model in Hugging Face layout with its tokenizer; lora: the adapter with the tokenizer."""
    merged_path: Optional[Short] = None
    """The adapter merged into the base model, in Hugging Face layout (checkpoint.mergeFinalAdapter)."""


class OutputRecord(ApiModel):
    uri: Short
    """Where the trained model was pushed (spec.output.uri; on S3 the folder of the final model's files)."""
    revision: Optional[Short] = None
    """The hub commit of the push."""
    files: int = Field(0, ge=0)
    """Files of the pushed model."""
    bytes: int = Field(0, ge=0)
    """Their size."""


class EvaluationRecord(ApiModel):
    baseline: Optional[float] = None
    """Held-out score before the first training step (evaluation.atStart)."""
    step: Optional[int] = Field(None, ge=0)
    """The step of the last evaluation."""
    score: Optional[float] = None
    """The mean reward of the last evaluation."""
    pass_at_k: Optional[float] = None
    """The share of evaluation tasks with a sample scoring at least evaluation.passReward, at the last evaluation."""
    best_step: Optional[int] = Field(None, ge=0)
    """The step of the best evaluation."""
    best_score: Optional[float] = None
    """The best evaluation's score."""
    best_checkpoint: Optional[Short] = None
    """The checkpoint of the best evaluation, on the checkpoint claim (kept with evaluation.keepBest)."""
    stop_reason: Optional[Literal["scoreAtLeast", "patience"]] = None
    """Why training stopped before trainer.maxSteps (evaluation.stopWhen)."""


class ErrorCounts(ApiModel):
    timeouts: int = Field(0, ge=0)
    """Samples whose evaluator timed out."""
    runtime_errors: int = Field(0, ge=0)
    """Samples whose evaluator raised."""
    parse_errors: int = Field(0, ge=0)
    """Samples from which no answer could be parsed."""
    dropped_episodes: int = Field(0, ge=0)
    """Episodes dropped as too stale or duplicated."""
    reissued_leases: int = Field(0, ge=0)
    """Task leases that expired and were issued again."""
    refused_episodes: int = Field(0, ge=0)
    """Episodes the coordinator refused: not from the live lease holder, or invalid (non-finite rewards,
    token ids outside the vocabulary, lengths beyond the limits)."""


class RetryRecord(ApiModel):
    count: int = Field(0, ge=0)
    """How many times the job was retried after failing (a spec edit, or the rft.dev/retry annotation that kubectl rft resume sets)."""
    restarts_at_retry: int = Field(0, ge=0)
    """status.restarts when it was last retried: the restart budget (spec.restartLimit) counts from there."""
    failure: Text = ""
    """The failure it was last retried from (reason: message)."""
    time: Optional[Time] = None
    """When it was last retried."""


class DisruptionRecord(ApiModel):
    job_uid: str = Field("", max_length=64)
    """The trainer Job (uid) a disrupted pod belonged to: its failure is recreated without spending a restart."""
    pod: Text = ""
    """The pod, the reason and the message of its DisruptionTarget condition."""
    time: Optional[Time] = None
    """When the operator first saw it."""


class RFTJobStatus(ApiModel):
    phase: Phase = "Pending"
    """Pending, Provisioning, Running, Succeeded, Failed, Suspended or ValidationFailed."""
    message: Text = ""
    """Why the job is in its phase."""
    observed_generation: Optional[int] = Field(None, ge=0)
    """The spec generation last reconciled."""
    conditions: list[Condition] = Field(default_factory=list, max_length=16)
    """Kubernetes-style conditions."""
    roles: RolesStatus = Field(default_factory=RolesStatus)
    """Ready and desired replicas per role."""
    step: int = Field(0, ge=0)
    """Completed training steps."""
    total_steps: int = Field(0, ge=0)
    """trainer.maxSteps."""
    policy_version: int = Field(0, ge=0)
    """Version of the policy weights published to inference."""
    reward_mean: Optional[float] = None
    """Mean reward of the last step."""
    reward_std: Optional[float] = None
    """Standard deviation of the reward in the last step."""
    eval_score: Optional[float] = None
    """Mean reward on the evaluation set at the last evaluation."""
    domain_rewards: dict[str, float] = Field(default_factory=dict)
    """Mean reward of the last step per task domain (dataset.mix, per-domain evaluators)."""
    eval_domain_scores: dict[str, float] = Field(default_factory=dict)
    """Mean reward per task domain at the last evaluation (when the evaluation set has several domains)."""
    evaluation: Optional[EvaluationRecord] = None
    """Held-out evaluation: the baseline, the last and the best score and checkpoint, and why training stopped early."""
    last_checkpoint: Optional[CheckpointRecord] = None
    """The latest complete checkpoint."""
    checkpoints: list[CheckpointRecord] = Field(default_factory=list, max_length=1000)
    """Checkpoints retained on the volume, oldest first."""
    final_model: Optional[FinalModelRecord] = None
    """Where the trained policy is once the job Succeeded (on the checkpoint claim; keep it with checkpoint.retainOnDelete)."""
    output: Optional[OutputRecord] = None
    """Where the trained model was pushed (spec.output), once it was; condition OutputPushed says why it was not."""
    errors: ErrorCounts = Field(default_factory=ErrorCounts)
    """Counters of evaluator errors and coordinator drops."""
    restarts: int = Field(0, ge=0)
    """Trainer restarts so far (bounded by spec.restartLimit, counted from the last retry)."""
    trainer_disruption: Optional[DisruptionRecord] = None
    """The last trainer pod seen disrupted (evicted, preempted, node drained), kept until its Job is replaced."""
    retry: Optional[RetryRecord] = None
    """Set once a Failed job was retried: it resumed from its latest checkpoint instead of staying Failed."""
    start_time: Optional[Time] = None
    """When the job first started running."""
    completion_time: Optional[Time] = None
    """When the job reached Succeeded or Failed."""
