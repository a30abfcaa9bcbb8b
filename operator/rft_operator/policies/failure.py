"""Failure policy: the trainer restart budget, the active deadline, and an evaluator that always fails.

Restart budget (``spec.restartLimit``). The trainer Job runs with ``backoffLimit: 0``; the operator
owns restarts. Each trainer Job carries the attempt it belongs to (annotation
``rft.dev/trainer-attempt``), and ``status.restarts`` is the attempt that should run. The counting is
level-triggered and survives an operator crash at any point:

1. the Job of attempt ``restarts`` has failed and budget is left → ``status.restarts + 1`` is written
   (the failed Job is left alone in this reconcile);
2. a Job whose attempt is below ``status.restarts`` is stale → deleted;
3. no trainer Job → the Job of attempt ``status.restarts`` is created; its trainer resumes from the
   latest checkpoint.

When the Job of attempt ``restarts`` fails with no budget left (``restarts == restartLimit``) the job
is Failed with reason ``RestartLimitExceeded``.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import Enum
from typing import Optional

from rft_api.spec import RFTJobSpec

from ..observe import TrainerObs
from rft_api.progress import Progress


@dataclass(frozen=True)
class Failure:
    """Why a job failed: a CamelCase reason and a message."""

    reason: str
    message: str


class TrainerAction(str, Enum):
    """What the reconcile does with the trainer Job."""

    APPLY = "apply"            # create it, or re-apply the current attempt
    DELETE_STALE = "delete"    # a Job of an earlier attempt: delete it, create the next one later
    WAIT = "wait"              # the stale Job is still being deleted


def fresh_failure(trainer: Optional[TrainerObs], restarts: int) -> bool:
    """The Job of the current attempt has failed (and that failure is not yet counted)."""
    return trainer is not None and trainer.failed_condition and trainer.attempt >= restarts


def next_restarts(trainer: Optional[TrainerObs], restarts: int, restart_limit: int) -> tuple[int, Optional[Failure]]:
    """The restart count after this observation, and the failure when the budget is spent."""
    if not fresh_failure(trainer, restarts):
        return restarts, None
    if restarts < restart_limit:
        return restarts + 1, None
    assert trainer is not None
    detail = f": {trainer.reason}: {trainer.message}" if trainer.reason or trainer.message else ""
    return restarts, Failure(
        "RestartLimitExceeded",
        f"the trainer failed {restarts + 1} time(s); spec.restartLimit is {restart_limit}{detail}")


def trainer_action(trainer: Optional[TrainerObs], persisted_restarts: int) -> TrainerAction:
    """What to do with the trainer Job, given the restart count already written to status."""
    if trainer is None:
        return TrainerAction.APPLY
    if trainer.attempt < persisted_restarts:
        return TrainerAction.WAIT if trainer.terminating else TrainerAction.DELETE_STALE
    return TrainerAction.APPLY


def deadline_failure(spec: RFTJobSpec, clock_start: Optional[dt.datetime], now: dt.datetime) -> Optional[Failure]:
    """``spec.activeDeadlineSeconds`` exceeded since the clock started (see ``suspend.clock_start``)."""
    limit = spec.active_deadline_seconds
    if limit is None or clock_start is None:
        return None
    elapsed = (now - clock_start).total_seconds()
    if elapsed < limit:
        return None
    return Failure("DeadlineExceeded",
                   f"the job ran {int(elapsed)}s; spec.activeDeadlineSeconds is {limit}")


def min_samples_for_evaluator_verdict(spec: RFTJobSpec) -> int:
    """Samples that must have been scored before an always-failing evaluator fails the job: one step's worth."""
    return spec.rollout.prompts_per_step * spec.rollout.samples_per_prompt


def evaluator_failure(spec: RFTJobSpec, progress: Optional[Progress]) -> Optional[Failure]:
    """Every sample scored so far (at least one step's worth) ended in an evaluator timeout or error.

    Parse errors do not count: an untrained policy often produces no parsable answer, which is a
    reward of 0, not a broken evaluator.
    """
    if progress is None:
        return None
    n = progress.samples_scored
    errs = progress.errors.timeouts + progress.errors.runtime_errors
    if n < max(1, min_samples_for_evaluator_verdict(spec)) or errs < n:
        return None
    return Failure("EvaluatorFailing",
                   f"the evaluator failed on every one of the {n} samples scored "
                   f"({progress.errors.timeouts} timeouts, {progress.errors.runtime_errors} runtime errors)")
