"""The reconcile plan: which workloads should exist, from the phase and the observation (pure).

Children that hold state or identity (config and progress ConfigMaps, Services, the checkpoint claim,
the trainer's ServiceAccount/Role/RoleBinding) always exist for a valid job. The role workloads follow
the suspend policy and the failure policy:

- no role workload exists before the job's hf:// and s3:// inputs are fetched (``policies.inputs``),
  and the fetch Job, once it exists, is kept (its pods' logs and messages);
- nothing new is created for a ValidationFailed job (its workloads are deleted, the rest is left);
- Deployments exist while the job is neither suspended nor terminal;
- the trainer Job is applied for the current attempt, an earlier attempt's Job (or one whose
  immutable spec an edit changed) is deleted first, in the foreground, and waited for
  (see ``policies.failure``); in a terminal phase a finished trainer Job is kept (its pods' logs) and
  an unfinished one is deleted (a job that Failed on its deadline stops training).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from rft_api.status import DisruptionRecord

from .observe import Observed
from .policies import failure, suspend
from .policies.inputs import InputsState
from .policies.phase import is_terminal


class TrainerStep(str, Enum):
    APPLY = "apply"      # apply the Job of ``attempt``
    KEEP = "keep"        # leave the existing Job as it is
    DELETE = "delete"    # delete the existing Job
    ABSENT = "absent"    # no Job, and none is wanted


@dataclass(frozen=True)
class Plan:
    deployments: bool
    trainer: TrainerStep
    attempt: int
    stateful: bool = True
    """Whether the state/identity children are applied (not for ValidationFailed: existing ones are
    left alone, none is created)."""
    fetch: bool = False
    """Whether the fetch Job of the job's inputs is applied (kept once it ran: ``policies.inputs``)."""


def make_plan(suspend_: bool, phase: str, observed: Observed, persisted_restarts: int,
              trainer_template_hash: str = "", inputs: Optional[InputsState] = None,
              disruption: Optional[DisruptionRecord] = None) -> Plan:
    """What to apply and delete this reconcile (``persisted_restarts``: ``status.restarts`` as stored;
    ``trainer_template_hash``: that of the trainer Job that should run; ``inputs``: where the fetch of
    the job's inputs stands, whose completion the roles wait for; ``disruption``: the status's record of
    a trainer pod disrupted, ``policies.failure.disruption_record``)."""
    t = observed.trainer
    ready = inputs is None or inputs.ready
    fetch = inputs is not None and inputs.wanted and phase != "ValidationFailed" and \
        (observed.fetch is not None or not (suspend_ or is_terminal(phase)))
    deployments = ready and suspend.deployments_allowed(suspend_, phase)
    if not ready:
        step = TrainerStep.DELETE if t is not None else TrainerStep.ABSENT
    elif not suspend.trainer_allowed(suspend_, phase):
        step = TrainerStep.DELETE if t is not None else TrainerStep.ABSENT
    elif is_terminal(phase):
        if t is None:
            step = TrainerStep.ABSENT
        else:
            step = TrainerStep.KEEP if t.finished else TrainerStep.DELETE
    else:
        action = failure.trainer_action(t, persisted_restarts, trainer_template_hash,
                                        disrupted=failure.disrupted(observed, disruption))
        step = {failure.TrainerAction.APPLY: TrainerStep.APPLY,
                failure.TrainerAction.DELETE_STALE: TrainerStep.DELETE,
                failure.TrainerAction.WAIT: TrainerStep.KEEP}[action]
    return Plan(deployments=deployments, trainer=step, attempt=persisted_restarts,
                stateful=phase != "ValidationFailed", fetch=fetch)
